"""Other spellings of config keys, in one place.

- The seeds' and verl's names for a key (`sat_seq.agents`, `data.train_files`, ...) are read as
  they are, silently: a seeds' config or a verl user's override works unchanged.
- Round 3's names that changed (`trainer.update_steps`, `algorithm.kl_ctrl.dkw_eta`,
  `output.tensorboard`) are read with a FutureWarning, once per process.

`spell_as_today(data)` rewrites a raw config (the YAML mapping, before validation) to today's
keys; `today_key(path)` maps an override's key path, so that `--set sat_seq.agents.0.path=...`
and `--set team.agents.0.path=...` reach the same list whatever the file spelled. Both run
before the schema (`satseq.config.schema`) sees the data, which knows only today's keys.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

ALIASES = {
    "sat_seq.agents": "team.agents",  # the seeds' place of the team
    "sat_seq.max_backtracks": "algorithm.kl_ctrl.max_backtracks",
    "sat_seq.on_exhausted": "algorithm.kl_ctrl.on_exhausted",
    "data.train_files": "data.train",  # verl's
}
"""Another tool's name → today's key: read silently."""

DEPRECATED = {
    "trainer.update_steps": "trainer.ppo_epochs",
    "algorithm.kl_ctrl.dkw_eta": "algorithm.kl_ctrl.eta",
}
"""An old name of ours → today's key: read with a FutureWarning."""

WHY = {
    "trainer.update_steps": "passes over the batch; trainer.mini_batch_size sets the optimiser "
    "steps of each pass",
    "algorithm.kl_ctrl.dkw_eta": "the confidence of the certified level "
    "trust/certified_alpha/<agent>; the quantile check is the in-sample one (design §4)",
}


def today_key(key_path: str) -> str:
    """`key_path` under today's name: an old spelling's prefix replaced
    (`sat_seq.agents.0.path` → `team.agents.0.path`)."""
    for old, new in (ALIASES | DEPRECATED).items():
        if key_path == old or key_path.startswith(old + "."):
            if old in DEPRECATED:
                _warn_once(f"{old} is deprecated: it is {new} ({WHY[old]})")
            return new + key_path[len(old) :]
    return key_path


def spell_as_today(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of the raw config `data` with every old spelling moved to today's key. An old
    and a new spelling of one key that disagree are a ValueError naming both."""
    data = copy.deepcopy(data)
    for old, new in (ALIASES | DEPRECATED).items():
        found, value = _pop(data, old)
        if not found:
            continue
        if old == "algorithm.kl_ctrl.dkw_eta" and value is None:  # null: the in-sample quantile
            value = _get(data, new, default=None)
        if old in DEPRECATED:
            _warn_once(f"{old} is deprecated: it is {new} ({WHY[old]})")
        present, current = _has(data, new)
        if present and current != value and value is not None:
            why = "the seeds' or verl's name" if old in ALIASES else "its old name"
            raise ValueError(f"{old} ({why}) and {new} disagree: give {new} only")
        if value is not None:
            _put(data, new, value)
    return _tensorboard_is_a_tracker(data)


def _tensorboard_is_a_tracker(data: dict[str, Any]) -> dict[str, Any]:
    """`output.tensorboard: bool` is `output.trackers: [tensorboard]` or `[]`."""
    found, tensorboard = _pop(data, "output.tensorboard")
    if not found:
        return data
    if _has(data, "output.trackers")[0]:
        raise ValueError(
            "output.tensorboard is the old spelling of output.trackers: give only "
            "output.trackers, e.g. [tensorboard, mlflow]"
        )
    if not isinstance(tensorboard, bool):
        raise ValueError(
            f"output.tensorboard must be true or false, got {tensorboard!r} (better: "
            "output.trackers: [tensorboard] or [])"
        )
    trackers = ["tensorboard"] if tensorboard else []
    _warn_once(
        f"output.tensorboard is deprecated: it is output.trackers: [{', '.join(trackers)}] "
        "(which also takes mlflow and wandb)",
    )
    _put(data, "output.trackers", trackers)
    return data


def _warn_once(message: str) -> None:
    # Python's default filter shows a FutureWarning once per message and caller: no registry here
    warnings.warn(message, FutureWarning, stacklevel=3)


def _parent(data: dict[str, Any], key_path: str, create: bool) -> tuple[Any, str]:
    *sections, leaf = key_path.split(".")
    node: Any = data
    for section in sections:
        if not isinstance(node, dict):
            return None, leaf
        if create and not isinstance(node.get(section), dict):
            node[section] = {}
        node = node.get(section)
    return (node if isinstance(node, dict) else None), leaf


def _has(data: dict[str, Any], key_path: str) -> tuple[bool, Any]:
    node, leaf = _parent(data, key_path, create=False)
    return (node is not None and leaf in node), (node or {}).get(leaf)


def _get(data: dict[str, Any], key_path: str, default: Any) -> Any:
    present, value = _has(data, key_path)
    return value if present else default


def _pop(data: dict[str, Any], key_path: str) -> tuple[bool, Any]:
    node, leaf = _parent(data, key_path, create=False)
    if node is None or leaf not in node:
        return False, None
    return True, node.pop(leaf)


def _put(data: dict[str, Any], key_path: str, value: Any) -> None:
    node, leaf = _parent(data, key_path, create=True)
    node[leaf] = value
