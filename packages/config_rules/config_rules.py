"""How both programs refuse their config: one line per mistake, `config 'KEY' = VALUE is not allowed: WHAT IS`.

The settings are pydantic models whose field aliases are the config keys. `validated` runs one and turns the first
error into that line; a cross-key rule raises ConfigError itself (pydantic lets it through). The types below keep
Pulumi's text values strict: "5" is a whole number, "true" a flag, but "yes", "on" or 1 are not flags.
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import pulumi
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

# Keys in a provider's namespace are the provider's to check.
PROVIDER_NAMESPACES = ("gcp", "kubernetes", "pulumi")


class ConfigError(pulumi.RunError):
    """A config value that cannot work. Pulumi prints the message alone, without a traceback."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        shown = "is not set" if value is None else f"= {value!r} is not allowed"
        super().__init__(f"config '{key}' {shown}: {allowed}")


class UnknownKeyError(ConfigError):
    """A config key the program does not read: it would be ignored without a word."""

    def __init__(self, key: str, hint: str) -> None:
        self.key, self.value, self.allowed = key, None, hint
        pulumi.RunError.__init__(self, f"config '{key}' is not a key this program reads: {hint}")


@dataclass(frozen=True)
class Allowed:
    """A field's rule in the error line's words (Annotated metadata): used for any error on the field other than
    its type's own."""

    text: str


@dataclass(frozen=True)
class Required:
    """A key without a default (Annotated metadata): unset or empty, its rule reads
    `required: WHAT (pulumi config set KEY ...)`."""

    what: str


@dataclass(frozen=True)
class Shown:
    """How the docs' Default column shows a field whose default the settings derive (Annotated metadata)."""

    text: str


@dataclass(frozen=True)
class Secret:
    """A secret key: read with Config.get_secret, never a field of the settings (they are dumped and shown)."""

    description: str
    required: bool


def _whole_number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise PydanticCustomError("whole_number", "a whole number")


def _flag(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise PydanticCustomError("flag", "true or false")


def _number(value: Any) -> Any:
    if not isinstance(value, bool) and isinstance(value, int | float | str):
        try:
            return float(value)
        except ValueError:
            pass
    raise PydanticCustomError("number", "a number")


def _text(value: Any) -> Any:
    # A stack file's `cpu: 64` or `gkeVersion: 1.35` reaches the program as a number; the key means its text.
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]
Flag = Annotated[bool, BeforeValidator(_flag)]
Number = Annotated[float, BeforeValidator(_number)]
Text = Annotated[str, BeforeValidator(_text)]
# The errors of the types above: their own words, whatever rule the field adds.
_TYPE_ERRORS = ("whole_number", "flag", "number")
_NUMBER_BOUNDS = ("greater_than_equal", "greater_than", "less_than_equal", "less_than", "multiple_of")

Model = TypeVar("Model", bound=BaseModel)


class Settings(BaseModel):
    """A settings model (or an object key's): frozen, an unknown key refused, each field's docstring its description
    (tools/config_docs.py); python-re, as some keys' rules need a lookahead."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, regex_engine="python-re")


def _as_read(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text.strip())
        except ValueError:
            pass
    return text


def validated(model: type[Model], values: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> Model:
    """The settings of `values` (keyed by config key), or the ConfigError of their first mistake."""
    try:
        return model.model_validate(values, context=context)
    except ValidationError as error:
        raise config_error(error, model) from None


def config_error(error: ValidationError, model: type[BaseModel]) -> ConfigError:
    first = error.errors(include_url=False)[0]
    loc, kind = first["loc"], first["type"]
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    owner, field = _field_at(model, loc)
    if kind == "extra_forbidden":
        known = list(keys_of(owner)) if owner else []
        parent = key.rpartition(".")[0]
        fields = f" ({parent} has {', '.join(known)})" if parent else ""
        return UnknownKeyError(key, closest(str(loc[-1]), known, {}) + fields)
    value = None if kind == "missing" else first["input"]
    if kind in _NUMBER_BOUNDS and isinstance(value, str):  # a bound around the text type: show the number it read
        value = _as_read(value)
    if kind in _TYPE_ERRORS:
        return ConfigError(key, value, first["msg"])
    metadata = list(getattr(field, "metadata", ()))
    if field is not None and owner is None:  # a list's or a map's item: its own type's rule first
        metadata[:0] = [m for arg in typing.get_args(field.annotation) for m in getattr(arg, "__metadata__", ())]
    rule = next((item.text for item in metadata if isinstance(item, Allowed)), None)
    required = next((item.what for item in metadata if isinstance(item, Required)), None)
    if required and value in (None, ""):
        rule = f"required: {required} (pulumi config set {key} ...)"
    return ConfigError(key, value, rule or _rule_of(kind, first.get("ctx", {}), field, first["msg"]))


def _rule_of(kind: str, ctx: Mapping[str, Any], field: Any, message: str) -> str:
    if kind == "literal_error" and field is not None:
        return f"one of {list(_literal_values(field.annotation))}"
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        return f"{bound} or more" if kind == "greater_than_equal" else f"more than {bound}"
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        return f"at most {bound}" if kind == "less_than_equal" else f"less than {bound}"
    if kind in ("model_type", "model_attributes_type", "dict_type") and field is not None:
        inner = _model_in(field.annotation)
        return f"an object with {', '.join(keys_of(inner))}" if inner else "an object"
    return {"string_type": "text", "list_type": "a list", "missing": "required"}.get(kind, message)


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return tuple(value for arg in typing.get_args(annotation) for value in _literal_values(arg))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, directly, optionally or as list items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple):
        return next(filter(None, map(_model_in, typing.get_args(annotation))), None)
    return None


def _field_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[type[BaseModel] | None, Any]:
    """The model owning the field at `loc` (aliases; list indexes skipped) and that field."""
    owner: type[BaseModel] | None = model
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        if owner is None:
            return None, field  # a map's key: the map's field
        field = next((f for name, f in owner.model_fields.items() if (f.alias or name) == part), None)
        if field is None:
            return owner, None
        if part != loc[-1]:
            owner = _model_in(field.annotation)
    return owner, field


def keys_of(model: type[BaseModel]) -> dict[str, Any]:
    """The model's config keys (field aliases) and their fields."""
    return {field.alias or name: field for name, field in model.model_fields.items()}


def object_keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The keys Pulumi hands over as JSON (objects and lists), read with Config.get_object."""
    return tuple(
        key
        for key, field in keys_of(model).items()
        if _model_in(field.annotation)
        or {typing.get_origin(t) for t in (field.annotation, *typing.get_args(field.annotation))} & {list, tuple, dict}
    )


def alias_hint(key: str, aliases: Mapping[str, str]) -> str | None:
    """What to set instead of `key` when it is a known stand-in (by its letters alone: case, '_' and '-' dropped):
    a target naming a key ('KEY' ...) reads "did you mean 'KEY' ...?", any other is the hint as written."""
    target = aliases.get(re.sub(r"[^a-z0-9]", "", key.lower()))
    if not target:
        return None
    return f"did you mean {target}?" if target.startswith("'") else target


def closest(key: str, known: Iterable[str], aliases: Mapping[str, str], fallback: str = "") -> str:
    """The hint for an unknown key: a known stand-in, else the closest known key, else `fallback`."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    hint = alias_hint(key, aliases) or (f"did you mean '{match[0]}'?" if match else None)
    return hint or fallback or "see the configuration tables in docs/configuration.md"


def check_keys(
    project: str, keys: Iterable[str], known: Iterable[str], aliases: Mapping[str, str], fallback: str = ""
) -> None:
    """Refuse config the program would ignore without a word: an unknown key in the project's namespace (a
    misspelt key, or an object's field set without --path), or a key in a near miss of the namespace."""
    known = tuple(known)
    for full_key in sorted(keys):
        namespace, _, key = full_key.rpartition(":")
        if namespace == project and key not in known:
            if "." in key and key.split(".")[0] in known:
                raise UnknownKeyError(full_key, f"a nested key: pulumi config set --path {key} VALUE")
            raise UnknownKeyError(full_key, closest(key, known, aliases, fallback))
        if namespace not in (project, *PROVIDER_NAMESPACES) and difflib.get_close_matches(namespace, [project]):
            raise UnknownKeyError(full_key, f"its namespace is not {project!r}; did you mean '{project}:{key}'?")


def read_config(
    model: type[BaseModel], aliases: Mapping[str, str], fallback: str = "", secrets: Iterable[str] = ()
) -> dict[str, Any]:
    """The stack's values of the model's keys, by key, once keys the program would ignore are refused (check_keys):
    a provider's key (`gcp:project`) from its namespace, an object key as JSON (text that is not JSON, set without
    --path, as given: the key's own check names it); a key left unset is left out."""
    # Every key the engine handed the program: `pulumi up` passes them in PULUMI_CONFIG; mocks and tools/offline.py
    # set them in the runtime's map.
    given = set(pulumi.runtime.config.CONFIG.get()) | set(pulumi.runtime.config.get_config_env())
    check_keys(pulumi.get_project(), given, [*keys_of(model), *secrets], aliases, fallback)
    as_json = object_keys(model)
    values: dict[str, Any] = {}
    for key in keys_of(model):
        namespace, _, name = key.rpartition(":")
        text = pulumi.Config(namespace or None).get(name)
        if text is None:
            continue
        try:
            values[key] = json.loads(text) if key in as_json else text
        except ValueError:
            values[key] = text
    return values
