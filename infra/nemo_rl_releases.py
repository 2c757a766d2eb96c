"""The NeMo RL releases this project runs: one row per image tag, holding everything that differs between them.

The table lives in the infra project because the infra chooses the image (`nemoRlImage`): the row of its tag gives
the RayCluster its Ray version, and the infra exports the row (`nemoRlRelease`, `rayVersion`) so the job project
reads it through its StackReference, like every other fact about the cluster. The job project cannot import this
module (`pulumi up` in jobs/ has only jobs/ on its import path), and a copy there would be a second table to keep
in step; so the job stack takes the row as data and knows only how to write each data layout's overrides.

Every value is read from the tag's sources (NVIDIA-NeMo/RL at the tag; tests hold each row against
../shared/reference/nemo-rl-<tag>).
"""

from __future__ import annotations

from dataclasses import dataclass

# How a release's GRPO config names its dataset (the job stack writes the overrides for each):
# - FLAT_DATA (up to v0.5.0): one dataset under `data` (data.dataset_name, data.train_data_path, data.val_data_path,
#   data.input_key, data.output_key).
# - PER_SPLIT_DATA (from v0.6.0): `data.train` and `data.validation` each name a dataset, `data.default` holds what
#   both share (prompt, processor, environment, keys).
FLAT_DATA = "flat"
PER_SPLIT_DATA = "per-split"


@dataclass(frozen=True)
class NemoRlRelease:
    tag: str  # the image tag, e.g. v0.7.0
    ray_version: str  # the Ray the image runs (pyproject.toml / uv.lock): the RayCluster's rayVersion
    grpo_entrypoint: str  # the GRPO script, relative to the NeMo RL sources in the image
    data_layout: str  # FLAT_DATA or PER_SPLIT_DATA
    # From this DTensor tensor-parallel size on, the policy refuses a logprob batch size other than the micro batch
    # size (a batch-variant accuracy check in nemo_rl/models/policy/lm_policy.py, new in v0.7.0); None: no check.
    logprob_batch_check_from_tp: int | None

    def as_output(self) -> dict[str, str | int | None]:
        """The stack output the job stack reads (its Ray version is exported on its own, as `rayVersion`)."""
        return {
            "tag": self.tag,
            "grpoEntrypoint": self.grpo_entrypoint,
            "dataLayout": self.data_layout,
            "logprobBatchCheckFromTp": self.logprob_batch_check_from_tp,
        }


NEMO_RL_RELEASES: dict[str, NemoRlRelease] = {
    release.tag: release
    for release in (
        NemoRlRelease("v0.5.0", "2.49.2", "examples/run_grpo_math.py", FLAT_DATA, None),
        # v0.6.0 replaced run_grpo_math.py with run_grpo.py and moved to per-split data; v0.7.0 moved to Ray 2.55.1.
        NemoRlRelease("v0.7.0", "2.55.1", "examples/run_grpo.py", PER_SPLIT_DATA, 4),
    )
}
DEFAULT_IMAGE = "nvcr.io/nvidia/nemo-rl:v0.5.0"


def image_tag(image: str) -> str:
    """'nvcr.io/nvidia/nemo-rl:v0.7.0' -> 'v0.7.0', also with a digest after it ('...:v0.7.0@sha256:...'): the tag
    names the release, the digest only pins it. A registry port such as host:5000/... is not a tag."""
    named = image.split("@", 1)[0]
    return named.rsplit(":", 1)[1] if ":" in named.rsplit("/", 1)[-1] else ""


def release_for(image: str) -> NemoRlRelease | None:
    """The row of the image's tag, wherever the image is pulled from (a mirror keeps the tag); None if unknown."""
    return NEMO_RL_RELEASES.get(image_tag(image))
