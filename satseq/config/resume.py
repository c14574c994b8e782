"""What a resumed run trains with: the config it was started with (its output directory's
train_config.yaml), with only the changes that keep it the same run.

`satseq train --resume` takes the saved config, not the quickstart's; a CONFIG or overrides
given with it may change the keys of `SAFE_TO_CHANGE` (train longer, log elsewhere, validate
or save at another pace), and any other difference is refused with the difference shown,
unless forced. `--from-checkpoint RUN/checkpoints/stage_N` starts a new run from that stage
of another under the same rule.
"""

from __future__ import annotations

from typing import Any

from satseq.config.schema import RunConfig

SAFE_TO_CHANGE = (
    "trainer.stages",
    "trainer.max_generated_tokens",
    "trainer.val_every",
    "trainer.save_every",
    "trainer.max_stage_retries",
    "output.",
    "eval.",
    "serve.",
)
"""Keys (or section prefixes, with the dot) a resumed run may change: they do not change what
a stage computes."""


def config_differences(saved: RunConfig, wanted: RunConfig) -> dict[str, tuple[Any, Any]]:
    """dotted key → (saved value, wanted value), for every key whose value differs."""
    before, after = _flat(saved.model_dump(mode="json")), _flat(wanted.model_dump(mode="json"))
    return {
        key: (before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    }


def unsafe_differences(saved: RunConfig, wanted: RunConfig) -> dict[str, tuple[Any, Any]]:
    """The differences a resumed run may not make (outside `SAFE_TO_CHANGE`)."""
    return {
        key: values
        for key, values in config_differences(saved, wanted).items()
        if not any(key == safe or key.startswith(safe) for safe in SAFE_TO_CHANGE)
    }


def describe_differences(differences: dict[str, tuple[Any, Any]]) -> str:
    return "\n".join(f"  {key}: {old!r} → {new!r}" for key, (old, new) in differences.items())


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys (lists stay values: an agent list is one key)."""
    if not isinstance(data, dict):
        return {prefix[:-1]: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat |= _flat(value, f"{prefix}{key}.")
    return flat
