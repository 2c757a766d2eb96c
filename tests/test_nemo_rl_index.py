"""tools/nemo_rl_index.json, the index `make plan` checks recipes and overrides against, held to the releases'
sources (../shared/reference) through their own loader, and its verdicts held to the loader's."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import upstream

from infra.nemo_rl_releases import NEMO_RL_RELEASES
from tools import nemo_rl_index, stack_check

QWEN = "examples/configs/recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v3.yaml"
# What a rebuild of one release's entry is made of, besides that release's sources: the builder, the loader it runs
# and the loader's virtualenv (its pins, and its stamp, renewed whenever make rebuilds it).
REBUILD_INPUTS = (
    "tools/nemo_rl_index.py",
    "tools/nemorl_config.py",
    "requirements-nemorl.txt",
    ".venv-nemorl/.installed",
)


def _rebuild_digest(sources: Path) -> str:
    """A digest of every input of a rebuild: the same digest, the same rebuild (the loader is deterministic)."""
    digest = hashlib.sha256()
    # Bytecode a Python left in the tree is no input (it would make every run a new rebuild).
    files = sorted(path for path in sources.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    for path in [*(upstream.ROOT / name for name in REBUILD_INPUTS), *files]:
        digest.update(f"{path.relative_to(path.anchor)}\0".encode())
        digest.update(path.read_bytes() if path.is_file() else b"absent")
    return digest.hexdigest()


def _rebuilt(tag: str, cache: pytest.Cache) -> dict[str, Any]:
    """The release's entry as its own loader resolves it from the reference: a warm run reuses the rebuild of the
    same inputs from pytest's cache (about 75 s of CPU each); the stored index is compared with it every run."""
    sources = upstream.reference(f"nemo-rl-{tag}")
    upstream.nemo_rl_python()
    key = f"nemo-rl-index/{tag}/{_rebuild_digest(sources)}"
    fresh: dict[str, Any] | None = cache.get(key, None)
    if fresh is None:
        fresh = nemo_rl_index.release_index(sources)
        cache.set(key, fresh)
    return fresh


def test_the_index_covers_every_release_the_infra_runs():
    assert set(nemo_rl_index.TAGS) == set(NEMO_RL_RELEASES) == set(nemo_rl_index.load())


@pytest.mark.parametrize("tag", nemo_rl_index.TAGS)
def test_the_index_is_what_the_releases_loader_resolves_from_the_reference(tag: str, request: pytest.FixtureRequest):
    """Regenerated from ../shared/reference/nemo-rl-<tag> with the release's own loader, the index is unchanged:
    refresh it with `python3 tools/nemo_rl_index.py --write` when this fails."""
    assert request.config.cache is not None
    fresh = _rebuilt(tag, request.config.cache)
    stored = nemo_rl_index.load()[tag]
    assert stored["source"] == fresh["source"]
    assert sorted(stored["recipes"]) == sorted(fresh["recipes"])
    changed = [path for path in fresh["recipes"] if fresh["recipes"][path] != stored["recipes"][path]]
    assert changed == [], f"{nemo_rl_index.WRITE_COMMAND} refreshes these entries"
    # Only what the reference cannot resolve is left without keys, and the entry says why.
    unindexed = {path: entry["unindexed"] for path, entry in stored["recipes"].items() if "unindexed" in entry}
    why = "the loader could not resolve it from the sources the index was made from: "
    assert all(reason.startswith(why) for reason in unindexed.values())
    assert len(unindexed) < len(stored["recipes"]) / 10


def test_a_changed_input_is_a_new_rebuild(tmp_path: Path):
    """The cached rebuild is keyed by every input: a recipe changed, added or removed is rebuilt."""
    sources = tmp_path / "nemo-rl"
    (sources / "examples").mkdir(parents=True)
    recipe = sources / "examples" / "a.yaml"
    recipe.write_text("grpo:\n  max_num_steps: 10\n")
    first = _rebuild_digest(sources)
    assert _rebuild_digest(sources) == first
    recipe.write_text("grpo:\n  max_num_steps: 20\n")
    changed = _rebuild_digest(sources)
    (sources / "examples" / "__pycache__").mkdir()
    (sources / "examples" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"bytecode")
    assert _rebuild_digest(sources) == changed
    (sources / "examples" / "b.yaml").write_text("grpo: {}\n")
    added = _rebuild_digest(sources)
    assert len({first, changed, added}) == 3


def test_a_stored_entry_rebuilds_the_full_key_set():
    """A recipe stored against its base rebuilds to what the loader resolved: the shipped recipe's keys, through
    the loader, against the index's."""
    resolved = upstream.resolve_with_nemo_rl(upstream.reference("nemo-rl-v0.5.0"), [f"--config={QWEN}"])
    assert "base" in nemo_rl_index.recipes("v0.5.0")[QWEN]
    assert nemo_rl_index.keys_of("v0.5.0", QWEN) == nemo_rl_index.flat_keys(resolved)
    values = nemo_rl_index.values_of("v0.5.0", QWEN)
    assert values["grpo.max_num_steps"] == resolved["grpo"]["max_num_steps"]
    assert values["policy.model_name"] == resolved["policy"]["model_name"]


# Override items whose fate the index decides as the loader does (types are the index's own check: the loader,
# its config untyped, takes any value).
ITEMS = [
    "grpo.max_num_step=20",
    "grpo.max_num_steps=20",
    "+grpo.max_num_step=20",
    "+grpo.seed=1",
    "++grpo.seed=1",
    "~checkpointing.keep_top_k",  # (not ~grpo.seed: v0.7.0's data.train.seed refers to it, which only the loader sees)
    "~grpo.nope",
    "~loss_fn.ratio_clip_c",  # null in the recipe: Hydra finds nothing to delete
    "+loss_fn.ratio_clip_c=3",  # null: Hydra appends over it
    "+policy.optimizer.kwargs.betas=[0.9,0.99]",  # a list: Hydra merges it
    "cluster.x=1",
]


@pytest.mark.parametrize("tag", nemo_rl_index.TAGS)
@pytest.mark.parametrize("item", ITEMS)
def test_the_index_refuses_what_the_loader_refuses(tag: str, item: str):
    sources = upstream.reference(f"nemo-rl-{tag}")
    keys = nemo_rl_index.keys_of(tag, QWEN)
    assert keys is not None
    problems, _ = stack_check.override_problems(keys, [(item, "override")], QWEN, tag, {})
    try:
        upstream.resolve_with_nemo_rl(sources, [f"--config={QWEN}", item])
        loader = "accepted"
    except upstream.NemoRlRefusedError:
        loader = "refused"
    assert ("refused" if problems else "accepted") == loader, problems
