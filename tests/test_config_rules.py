"""The shared refusal of config (packages/config_rules): pydantic's errors become the one-line message both
programs print, and Pulumi's text values stay strict."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from config_rules import (
    Allowed,
    ConfigError,
    Flag,
    Text,
    UnknownKeyError,
    WholeNumber,
    check_keys,
    object_keys,
    validated,
)
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    capacity: WholeNumber = Field(18_000, alias="capacityGib", ge=9_000)
    subnets: list[Annotated[Text, Allowed("a CIDR range")]] = Field(
        default_factory=lambda: ["10.0.0.0/8"], alias="subnets", min_length=1
    )


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: WholeNumber = Field(2, alias="gpuNodes", ge=1)
    mode: Literal["reservation", "spot"] = Field("reservation", alias="gpuProvisioning")
    protect: Flag = Field(True, alias="protectData")
    # The bound around the text type (not inside it): the error still shows the number read.
    hours: Annotated[WholeNumber, Field(alias="maxRunHours", le=168)] = 0
    name: Annotated[Text, Allowed("lowercase letters")] = Field("nemo", alias="clusterName", pattern="^[a-z]+$")
    inner: _Inner = Field(default_factory=lambda: _Inner.model_validate({}), alias="lustre")

    @model_validator(mode="after")
    def _not_seven(self) -> _Model:
        if self.nodes == 7:
            raise ConfigError("gpuNodes", self.nodes, "anything but 7")
        return self


@pytest.mark.parametrize(
    ("values", "line"),
    [
        ({"gpuNodes": "0"}, "config 'gpuNodes' = 0 is not allowed: 1 or more"),
        ({"gpuNodes": "two"}, "config 'gpuNodes' = 'two' is not allowed: a whole number"),
        ({"gpuNodes": True}, "config 'gpuNodes' = True is not allowed: a whole number"),
        (
            {"gpuProvisioning": "flex"},
            "config 'gpuProvisioning' = 'flex' is not allowed: one of ['reservation', 'spot']",
        ),
        ({"protectData": "yes"}, "config 'protectData' = 'yes' is not allowed: true or false"),
        ({"protectData": 1}, "config 'protectData' = 1 is not allowed: true or false"),
        ({"protectData": "on"}, "config 'protectData' = 'on' is not allowed: true or false"),
        ({"clusterName": "Nemo"}, "config 'clusterName' = 'Nemo' is not allowed: lowercase letters"),
        ({"lustre": {"capacityGib": "5"}}, "config 'lustre.capacityGib' = 5 is not allowed: 9000 or more"),
        ({"lustre": {"subnets": ["a", 5, {}]}}, "config 'lustre.subnets[2]' = {} is not allowed: a CIDR range"),
        ({"lustre": "big"}, "config 'lustre' = 'big' is not allowed: an object with capacityGib, subnets"),
        ({"gpuNodes": "7"}, "config 'gpuNodes' = 7 is not allowed: anything but 7"),
        ({"maxRunHours": "200"}, "config 'maxRunHours' = 200 is not allowed: at most 168"),
    ],
)
def test_each_mistake_is_one_line_naming_key_value_and_rule(values: dict[str, object], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        validated(_Model, values)
    assert str(refused.value) == line


def test_text_values_are_read_as_pulumi_hands_them_over() -> None:
    settings = validated(_Model, {"gpuNodes": " 3", "protectData": "False", "lustre": {"capacityGib": "9000"}})
    assert (settings.nodes, settings.protect, settings.inner.capacity) == (3, False, 9000)


def test_a_misspelt_field_of_an_object_names_the_closest_one() -> None:
    with pytest.raises(UnknownKeyError) as refused:
        validated(_Model, {"lustre": {"capacityGb": 9000}})
    assert str(refused.value) == (
        "config 'lustre.capacityGb' is not a key this program reads: did you mean 'capacityGib'? "
        "(lustre has capacityGib, subnets)"
    )


def test_unknown_keys_are_refused_with_a_hint() -> None:
    known = ("gpuNodes", "lustre")
    with pytest.raises(UnknownKeyError, match=r"'proj:gpuNode' .*did you mean 'gpuNodes'\?"):
        check_keys("proj", ["proj:gpuNode"], known, {})
    with pytest.raises(UnknownKeyError, match=r"did you mean 'gpuType' \(the GPU\)\?"):
        check_keys("proj", ["proj:machine_type"], known, {"machinetype": "'gpuType' (the GPU)"})
    with pytest.raises(UnknownKeyError, match=r"a nested key: pulumi config set --path lustre.x VALUE"):
        check_keys("proj", ["proj:lustre.x"], known, {})
    with pytest.raises(UnknownKeyError, match=r"its namespace is not 'proj'; did you mean 'proj:gpuNodes'\?"):
        check_keys("proj", ["prof:gpuNodes"], known, {})
    check_keys("proj", ["proj:gpuNodes", "gcp:project", "kubernetes:context"], known, {})


def test_objects_and_lists_are_the_keys_read_as_json() -> None:
    assert object_keys(_Model) == ("lustre",)
    assert object_keys(_Inner) == ("subnets",)
