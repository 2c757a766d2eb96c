"""The NeMo RL release table (infra/nemo_rl_releases.py): every row held against the sources of its tag
(../shared/reference/nemo-rl-<tag>), the image tag selecting the row in the infra settings, and the row reaching the
RayCluster and the stack outputs."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import shared_infra_run
from launcher.infra_outputs import DATA_LAYOUTS
from test_settings import expect_error, settings_with
from upstream import reference

from infra.nemo_rl_releases import (
    DEFAULT_IMAGE,
    FLAT_DATA,
    NEMO_RL_RELEASES,
    PER_SPLIT_DATA,
    NemoRlRelease,
    image_tag,
    release_for,
)
from infra.settings import ConfigError

RELEASES = list(NEMO_RL_RELEASES.values())
V070_IMAGE = "nvcr.io/nvidia/nemo-rl:v0.7.0"


def source_of(release: NemoRlRelease) -> Path:
    tree = reference(f"nemo-rl-{release.tag}")
    assert (tree / "SOURCE").read_text().split()[0] == release.tag
    return tree


# --- each row against its tag's sources ---------------------------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.tag)
def test_ray_version_is_the_one_the_release_requires(release: NemoRlRelease) -> None:
    # v0.5.0 pins ray[default]==2.49.2; v0.7.0 asks for >=2.55.1 and its uv.lock (which builds the image) locks 2.55.1.
    pyproject = (source_of(release) / "pyproject.toml").read_text()
    found = re.findall(r'"ray\[default\](?:==|>=)([0-9.]+)"', pyproject)
    assert found == [release.ray_version]


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.tag)
def test_grpo_entrypoint_exists_in_the_release(release: NemoRlRelease) -> None:
    tree = source_of(release)
    entrypoint = tree / release.grpo_entrypoint
    assert entrypoint.is_file()
    # It reads the data config the row names: the per-split entrypoint hands it to setup_response_data (which asserts
    # data.train), the flat one loads the whole `data` section as one dataset.
    text = entrypoint.read_text()
    if release.data_layout == PER_SPLIT_DATA:
        assert "setup_response_data(tokenizer, config.data" in text
        assert not (tree / "examples" / "run_grpo_math.py").exists()  # gone after v0.5.0
    else:
        assert "load_response_dataset(data_config, seed)" in text


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.tag)
def test_data_layout_is_the_base_configs(release: NemoRlRelease) -> None:
    base = yaml.safe_load((source_of(release) / "examples" / "configs" / "grpo_math_1B.yaml").read_text())["data"]
    if release.data_layout == FLAT_DATA:
        assert "dataset_name" in base and "train" not in base
    else:
        assert {"train", "validation", "default"} <= set(base) and "dataset_name" not in base


def _add_argument_flags(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.tag)
def test_converter_takes_the_arguments_we_pass_and_refuses_an_existing_output(release: NemoRlRelease) -> None:
    tree = source_of(release)
    assert _add_argument_flags(tree / "examples" / "converters" / "convert_dcp_to_hf.py") == {
        "--config",
        "--dcp-ckpt-path",
        "--hf-ckpt-path",
    }
    module = ast.parse((tree / "nemo_rl" / "utils" / "native_checkpoint.py").read_text())
    convert = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "convert_dcp_to_hf")
    defaults = dict(
        zip(
            [a.arg for a in convert.args.args][-len(convert.args.defaults) :],
            [ast.literal_eval(d) for d in convert.args.defaults],
            strict=True,
        )
    )
    assert defaults["overwrite"] is False
    raised = [n.exc for n in ast.walk(convert) if isinstance(n, ast.Raise) and n.exc is not None]
    assert any(isinstance(e, ast.Call) and getattr(e.func, "id", "") == "FileExistsError" for e in raised)


def test_math_reward_is_the_same_in_every_release() -> None:
    """The reward mirrored in tests/jobs/test_prepare_gsm8k.py (HFVerifyWorker of v0.5.0) is every release's."""

    def verify_worker(release: NemoRlRelease) -> str:
        path = source_of(release) / "nemo_rl" / "environments" / "math_environment.py"
        text = path.read_text()
        node = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "HFVerifyWorker")
        segment = ast.get_source_segment(text, node)
        assert segment is not None
        return segment

    first, *others = RELEASES
    assert all(verify_worker(release) == verify_worker(first) for release in others)
    assert "gold_extraction_target=(LatexExtractionConfig(),)" in verify_worker(first)


def test_every_data_layout_is_one_the_job_stack_can_write() -> None:
    assert {release.data_layout for release in RELEASES} <= set(DATA_LAYOUTS)
    assert {FLAT_DATA, PER_SPLIT_DATA} == set(DATA_LAYOUTS)


# --- the tag selects the row ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("nvcr.io/nvidia/nemo-rl:v0.7.0", "v0.7.0"),
        ("europe-docker.pkg.dev/p/mirror/nemo-rl:v0.7.0", "v0.7.0"),
        ("registry.local:5000/nemo-rl:v0.5.0", "v0.5.0"),
        ("registry.local:5000/nemo-rl", ""),
    ],
)
def test_image_tag(image: str, tag: str) -> None:
    assert image_tag(image) == tag


def test_default_image_is_v0_5_0() -> None:
    assert DEFAULT_IMAGE.endswith(":v0.5.0")
    settings = settings_with()
    assert settings.nemo_rl_release == NEMO_RL_RELEASES["v0.5.0"]
    assert settings.ray_version == "2.49.2"


@pytest.mark.parametrize("image", [V070_IMAGE, "europe-docker.pkg.dev/p/mirror/nemo-rl:v0.7.0"])
def test_v0_7_0_image_selects_its_row(image: str) -> None:
    settings = settings_with(nemoRlImage=image)
    assert settings.nemo_rl_release == release_for(image) == NEMO_RL_RELEASES["v0.7.0"]
    assert settings.ray_version == "2.55.1"
    assert settings_with(nemoRlImage=image, rayVersion="2.55.1").ray_version == "2.55.1"


def test_unknown_tag_without_ray_version_is_refused_naming_the_known_tags() -> None:
    with pytest.raises(ConfigError) as caught:
        settings_with(nemoRlImage="nvcr.io/nvidia/nemo-rl:v0.6.0")
    assert (caught.value.key, caught.value.value) == ("rayVersion", None)
    assert "nvcr.io/nvidia/nemo-rl:v0.6.0" in str(caught.value) and "v0.5.0, v0.7.0" in str(caught.value)
    custom = settings_with(nemoRlImage="nvcr.io/nvidia/nemo-rl:v0.6.0", rayVersion="2.54.0")
    assert custom.ray_version == "2.54.0" and custom.nemo_rl_release is None


def test_a_ray_version_contradicting_a_known_tag_is_refused() -> None:
    # A rayVersion left in the stack file from the old image must not survive switching the image.
    expect_error("rayVersion", "2.49.2", "2.55.1", nemoRlImage=V070_IMAGE, rayVersion="2.49.2")


# --- the row reaches the cluster and the outputs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def v070_run() -> Any:
    return shared_infra_run("h200", {"nemoRlImage": V070_IMAGE})


def test_v0_7_0_ray_cluster_and_outputs(v070_run: Any) -> None:
    values = v070_run.one("kubernetes:helm.sh/v3:Release").inputs["values"]
    assert values["image"]["repository"] == "nvcr.io/nvidia/nemo-rl" and values["image"]["tag"] == "v0.7.0"
    assert values["head"]["rayVersion"] == "2.55.1"
    assert v070_run.outputs["nemoRlImage"] == V070_IMAGE
    assert v070_run.outputs["rayVersion"] == "2.55.1"
    assert v070_run.outputs["nemoRlRelease"] == {
        "tag": "v0.7.0",
        "grpoEntrypoint": "examples/run_grpo.py",
        "dataLayout": PER_SPLIT_DATA,
        "logprobBatchCheckFromTp": 4,
    }


def test_default_outputs_carry_the_v0_5_0_row(stack_run: Any) -> None:
    _, run = stack_run
    assert run.outputs["nemoRlRelease"] == {
        "tag": "v0.5.0",
        "grpoEntrypoint": "examples/run_grpo_math.py",
        "dataLayout": FLAT_DATA,
        "logprobBatchCheckFromTp": None,
    }
