"""Day 2: the guard that refuses a change that would replace something expensive or stateful (or kill a running
training) unless the user lists the key in `allowReplace`; what each key's change does is infra/day2_effects.py.

Pure functions: no Pulumi runtime. The program records `deployed_settings` as a stack output; the next `pulumi up`
reads it back through a StackReference to its own stack and calls `refusals` before registering anything.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pulumi

from infra.day2_effects import (
    BUCKET_URN,
    DELETES_WORKERS,
    DEPLOYED_SETTINGS_OUTPUT,
    EFFECTS,
    EFFECTS_BY_KEY,
    IN_PLACE,
    LOCKS,
    NEEDS_ALLOWANCE,
    PROTECTED_BUCKET,
    RAY_CLUSTER,
    REFUSED,
    RENAMES_BUCKET,
    REPLACEABLE_KEYS,
    REPLACES,
    REPLACES_CLUSTER,
    REPLACES_GPU_POOL,
    REPLACES_LUSTRE,
    REPLACES_NETWORKS,
    ROLLS_NODES,
    KeyEffect,
)
from infra.keys import ALLOW_REPLACE_KEY, DERIVED_FROM, EXPORT_BUCKET_CREATE
from infra.settings import InfraSettings

# Names the guard's callers (tools/day2_preview.py, the tests) read here.
__all__ = [
    "ALLOW_REPLACE_KEY",
    "DELETES_WORKERS",
    "DEPLOYED_SETTINGS_OUTPUT",
    "EFFECTS",
    "REPLACEABLE_KEYS",
    "ROLLS_NODES",
]


def created_bucket_name(record: Mapping[str, Any]) -> str:
    """The name a recorded `exportBucket: create` gave its bucket (infra.settings.InfraSettings.export_bucket_name)."""
    return f"{record.get('gcp:project')}-{record.get('clusterName')}-models"


def compute_locks(protect_compute: bool, allowed: Collection[str]) -> tuple[bool, bool]:
    """Whether the cluster and the GPU pool carry Pulumi's protect for this `pulumi up`."""
    listed = set(allowed)
    return (
        protect_compute and not listed & set(REPLACES_CLUSTER),
        protect_compute and not listed & set(REPLACES_GPU_POOL),
    )


# In the record: which of DERIVED_FROM's keys this deployment derived (the user left them unset).
DERIVED_KEYS = "derivedKeys"
# What a key is recorded as when it is not set: undone with `pulumi config rm`.
_UNSET: dict[str, Any] = {"reservation": "", "maxRunHours": 0, "imageCacheDisk": "", "exportBucket": ""}


def deployed_settings(settings: InfraSettings, ray_pod_template: str, has_wandb_key: bool) -> dict[str, Any]:
    """The values the guard compares on the next `pulumi up`: the settings by config key (an object whose fields have
    effects of their own, key by key), nothing secret (the W&B key only as set or not). `ray_pod_template` is the
    digest that replaces the RayCluster when it changes (workloads.raycluster.replacement_digest)."""
    record = settings.model_dump(by_alias=True, mode="json", exclude={"allow_replace"})
    for key in [key for key in record if any(effect.startswith(f"{key}.") for effect in EFFECTS_BY_KEY)]:
        record |= {f"{key}.{field}": value for field, value in record.pop(key).items()}
    return {
        **record,
        "wandbApiKey": "set" if has_wandb_key else "not set",
        RAY_CLUSTER: ray_pod_template,
        DERIVED_KEYS: list(settings.derived_keys),
    }


_CHANGE_COLUMN = {
    "superset": "in place when the new range contains the old; else replaces",
    "increase": "in place when larger; smaller: {effect}",
}
_GATE_COLUMN = {REFUSED: "refused, even when listed", IN_PLACE: "passes"}
_GROWS = {"superset": "the new range contains the old: the subnet grows in place", "increase": "it grows in place"}


def markdown_table() -> str:
    """The table as docs/operations.md shows it (a test keeps the two equal)."""
    lines = [
        "| Key | Change | What it replaces or disrupts | Without `allowReplace` | From |",
        "|---|---|---|---|---|",
    ]
    for effect in EFFECTS:
        change = _CHANGE_COLUMN.get(effect.in_place_if, effect.effect).format(effect=effect.effect)
        gate = _GATE_COLUMN.get(effect.effect, "refused")
        lines.append(f"| `{effect.key}` | {change} | {effect.what} | {gate} | {effect.source} |")
    return "\n".join(lines) + "\n"


def _contains(old: Any, new: Any) -> bool:
    """Every old range inside the new one at the same position (a subnet grows in place)."""
    olds, news = (old, new) if isinstance(old, list) else ([old], [new])
    if not isinstance(news, list) or len(olds) != len(news):
        return False
    try:
        return all(
            ipaddress.ip_network(str(o)).subnet_of(ipaddress.ip_network(str(n)))  # type: ignore[arg-type]
            for o, n in zip(olds, news, strict=True)
        )
    except (TypeError, ValueError):
        return False


def _plain(value: Any) -> Any:
    """Numbers come back from stack outputs as floats: 18000.0 is 18000."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _in_place(effect: KeyEffect, old: Any, new: Any) -> bool:
    if effect.in_place_if == "superset":
        return _contains(old, new)
    if effect.in_place_if == "increase":
        try:
            return int(new) > int(old)
        except (TypeError, ValueError):
            return False
    return False


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(value[k])}" for k in sorted(value)) + "}"
    return repr(value)


def _config_value(value: Any) -> str:
    """A value as `pulumi config set` takes it (booleans as Pulumi writes them), quoted for the shell."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return text if re.fullmatch(r"[A-Za-z0-9_.:/@+-]+", text) else shlex.quote(text)


def undo_command(key: str, old: Any) -> str:
    """Commands that put the recorded value back, as the user would type them."""
    if key == "wandbApiKey":  # given no value, `pulumi config set` prompts for it: the key never enters a line
        return "pulumi config rm wandbApiKey" if old == "not set" else "pulumi config set --secret wandbApiKey"
    if isinstance(old, dict):
        return " && ".join(undo_command(f"{key}.{field}", old[field]) for field in sorted(old))
    if isinstance(old, list):  # the whole list again, so a longer new one leaves no item behind
        items = [undo_command(f"{key}[{n}]", item) for n, item in enumerate(old)]
        return " && ".join([f"pulumi config rm --path '{key}'", *items])
    # `--path 'a.b'` for a key inside an object; a plain or namespaced key as it is.
    target = f"--path '{key}'" if "." in key or "[" in key else key
    if _UNSET.get(key, object()) == old:
        return f"pulumi config rm {target}"
    return f"pulumi config set {target} {_config_value(old)}"


def _put_back(key: str, old: Any) -> str:
    return f"put the old value back: {undo_command(key, old)}"


def allow_command(key: str, index: int) -> str:
    return f"pulumi config set --path '{ALLOW_REPLACE_KEY}[{index}]' {key}"


@dataclass(frozen=True)
class Change:
    """One recorded key whose value differs from the last deployment's, and what that does."""

    key: str
    old: Any
    new: Any
    effect: str  # IN_PLACE, ROLLS_NODES, REPLACES or REFUSED, for this very change
    what: str
    follows: tuple[Change, ...] = ()  # derived keys that change because this one does
    allowed: bool = False  # listed in allowReplace (for a derived key: its cause is)

    @property
    def shown(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)}"

    @property
    def needs_allowance(self) -> bool:
        return self.effect in NEEDS_ALLOWANCE or any(f.needs_allowance for f in self.follows)


def _conditional(
    key: str, old: Any, new: Any, previous: Mapping[str, Any], current: Mapping[str, Any]
) -> KeyEffect | None:
    """A change whose effect depends on other recorded keys: refused where the engine would fail halfway."""
    effect = EFFECTS_BY_KEY[key]
    if key == "exportBucket":
        # To the created bucket's own name: the user keeps it, once out of the state (the protected-bucket line).
        kept = new == created_bucket_name(previous)
        dropped = old == EXPORT_BUCKET_CREATE and new != EXPORT_BUCKET_CREATE and not kept
        return PROTECTED_BUCKET if dropped and _plain(previous.get("protectData")) is True else None
    if key in ("gpuNodes", "rayWorkerReplicas") and _plain(previous.get("rayAutoscaling")) is True:
        return KeyEffect(key, IN_PLACE, "the autoscaler's limit: KubeRay deletes only the pods it names", effect.source)
    locks = [
        lock
        for lock, keys in (("protectData", REPLACES_LUSTRE), ("protectCompute", REPLACES_NETWORKS))
        if key in keys and _plain(previous.get(lock)) is True
    ]
    renamed = (
        key in RENAMES_BUCKET and previous.get("exportBucket") == current.get("exportBucket") == EXPORT_BUCKET_CREATE
    )
    if not locks and not renamed:
        return None
    reasons = [LOCKS[lock] for lock in locks]
    steps = []
    if locks:
        lifts = " && ".join(f"pulumi config set {lock} false" for lock in locks)
        steps.append(f"{lifts} && pulumi up with the old value (that lifts the locks; nothing is replaced)")
    if renamed:
        name = created_bucket_name(previous)
        reasons.append(
            f"it renames the export bucket the stack created ({name}), which pulumi-gcp replaces delete-first, and a "
            "bucket that holds objects cannot be deleted (force_destroy off)"
        )
        steps.append(
            f"keep the bucket out of the stack: pulumi state delete --force --target-dependents {BUCKET_URN} && "
            f"pulumi config set exportBucket {name} && pulumi up with the old value (the bucket is yours from then on)"
        )
    what = (
        f"{'; '.join(reasons)}: the update would fail halfway; to go ahead: first {', then '.join(steps)}; then "
        "this change with the key in allowReplace"
    )
    return KeyEffect(key, REFUSED, what, effect.source, effect.in_place_if, effect.ray_template)


def changes(previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]) -> list[Change]:
    """Every recorded key that changes, in table order, with what the change does. A key whose value the program
    derived from another (rayAutoscaling from gpuProvisioning, rayVersion from nemoRlImage) and that changes with it
    is reported under the key the user changed. No record (a first deployment) or a key the record lacks (an older
    version of the program) compares nothing."""
    if not previous:
        return []
    derived = set(current.get(DERIVED_KEYS, ()))
    found: dict[str, Change] = {}
    for effect in EFFECTS:
        key = effect.key
        if key == RAY_CLUSTER or key not in previous or key not in current:
            continue
        old, new = _plain(previous[key]), _plain(current[key])
        if old == new:
            continue
        chosen = _conditional(key, old, new, previous, current) or effect
        grows = chosen.guarded and _in_place(chosen, old, new)
        what = _GROWS.get(chosen.in_place_if, chosen.what) if grows else chosen.what
        found[key] = Change(key, old, new, IN_PLACE if grows else chosen.effect, what, allowed=key in allowed)
    # A derived key that changes because its source did is a consequence of that change.
    for key, source in DERIVED_FROM.items():
        if key in found and source in found and key in derived:
            cause = found[source]
            consequence = replace(found.pop(key), allowed=cause.allowed)
            found[source] = replace(cause, follows=(*cause.follows, consequence))
    result = list(found.values())
    old_template, new_template = previous.get(RAY_CLUSTER), current.get(RAY_CLUSTER)
    template_keys = {e.key for e in EFFECTS if e.ray_template}
    touched = {c.key for c in result} | {f.key for c in result for f in c.follows}
    if old_template is not None and old_template != new_template and not touched & template_keys:
        effect = EFFECTS_BY_KEY[RAY_CLUSTER]
        result.append(
            Change(RAY_CLUSTER, old_template, new_template, REPLACES, effect.what, allowed=RAY_CLUSTER in allowed)
        )
    return result


def _what(change: Change) -> str:
    verb = {REPLACES: "replaces ", IN_PLACE: "updates in place: ", DELETES_WORKERS: "changes "}.get(change.effect, "")
    text = f"{verb}{change.what}"
    for consequence in change.follows:
        text += (
            f"; and as {consequence.key} is not set, it follows {change.key} ({_show(consequence.old)} -> "
            f"{_show(consequence.new)}), which {_what(consequence)}"
        )
    return text


def refusals(previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]) -> list[str]:
    """One line per change the guard refuses, comparing the last deployment's record with this one's. Each line
    names the key the user changed, old and new value, what the change replaces or disrupts, the command that
    allows it (the next free allowReplace index, so following every line's command adds them all) and the command
    that puts the old value back. With several keys to allow, a last line allows them all at once."""
    lines: list[str] = []
    index = len(allowed)
    to_allow: list[str] = []
    for change in changes(previous, current, allowed):
        if change.effect == REFUSED:
            lines.append(f"{change.shown} is refused: {change.what}; or {_put_back(change.key, change.old)}")
        elif change.needs_allowance and not change.allowed:
            if change.key == RAY_CLUSTER:
                lines.append(
                    f"{RAY_CLUSTER}: the Ray pod template changed without a config change; replaces {change.what}; "
                    f"to go ahead: {allow_command(RAY_CLUSTER, index)}"
                )
            else:
                lines.append(
                    f"{change.shown} {_what(change)}; to go ahead: {allow_command(change.key, index)}, or "
                    f"{_put_back(change.key, change.old)}"
                )
            to_allow.append(change.key)
            index += 1
    if len(to_allow) > 1:
        pairs = " ".join(
            f"--plaintext '{ALLOW_REPLACE_KEY}[{n}]={key}'" for n, key in enumerate(to_allow, start=len(allowed))
        )
        lines.append(f"to go ahead with all {len(to_allow)}: pulumi config set-all --path {pairs}")
    return lines


def unused_allowances(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]
) -> list[str]:
    """Keys listed in allowReplace that do not change now: left there, they would let a later change through."""
    if not previous:
        return []
    changed = {c.key for c in changes(previous, current, allowed)}
    changed |= {f.key for c in changes(previous, current, allowed) for f in c.follows}
    if previous.get(RAY_CLUSTER) != current.get(RAY_CLUSTER):
        changed.add(RAY_CLUSTER)
    return [key for key in allowed if key not in changed]


class ReplacementRefused(pulumi.RunError):
    """Changes that would replace or disrupt what the stack runs. Pulumi prints the message alone."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__(
            "this `pulumi up` would replace or disrupt what the stack runs; nothing was changed:\n  "
            + "\n  ".join(lines)
        )


def check(previous: Mapping[str, Any] | None, current: Mapping[str, Any], allowed: Collection[str]) -> list[str]:
    """Raise ReplacementRefused for any refused change; otherwise return the allowReplace keys left unused."""
    lines = refusals(previous, current, allowed)
    if lines:
        raise ReplacementRefused(lines)
    return unused_allowances(previous, current, allowed)
