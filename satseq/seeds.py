"""Every seed satseq derives from a run's seed, in one place: per stage, per actor and per
sample. Each derivation has a stride of its own, so no two of them give two different draws the
same seed within a run (a prime stride over the stages: no stage's offsets reach the next's).

A sample-level seed of None stays None: that sampling is unseeded.
"""

from __future__ import annotations

STAGE_STRIDE = 1_000_003
"""Stage k samples with run_seed·STAGE_STRIDE + k; every offset within a stage stays below it."""
ROLLOUT_ACTOR_STRIDE = 1000
"""Rollout actor j's engines start from seed + 1000·j (their agents take the next seeds)."""
WORKER_STRIDE = 7919
"""A generation dealt over rollout workers: worker j samples with seed + 7919·j."""
TURN_STRIDE = 1_000_003
"""Tool turn t of a rollout samples with seed + TURN_STRIDE·t."""
ROUND_STRIDE = 104_729
"""Dynamic sampling's round r of a stage samples with seed + ROUND_STRIDE·r (past any worker's
and call's offset within a round)."""


def stage_seed(run_seed: int, stage: int) -> int:
    """Stage `stage`'s sampling (training rollouts, a swap's; the offline estimate's chunks)."""
    return run_seed * STAGE_STRIDE + stage


def rollout_actor_seed(seed: int, actor: int) -> int:
    """Rollout actor `actor`'s seed: actors never share a random stream."""
    return seed + ROLLOUT_ACTOR_STRIDE * actor


def agent_seed(seed: int, agent: int) -> int:
    """Agent `agent`'s (team order) engine or learner: agents that start from the same
    checkpoint still draw different samples."""
    return seed + agent


def worker_seed(seed: int | None, worker: int) -> int | None:
    """The seed of the share of a generation that worker `worker` samples."""
    return None if seed is None else seed + WORKER_STRIDE * worker


def call_seed(seed: int | None, call: int) -> int | None:
    """The `call`-th engine call of one generation (one per agent and n), or its prompt number
    `call` within one engine call: calls and prompts never share random draws."""
    return None if seed is None else seed + call


def round_seed(seed: int | None, round_: int) -> int | None:
    """Dynamic sampling's generation round `round_` of a stage (the first is round 0)."""
    return None if seed is None else seed + ROUND_STRIDE * round_


def turn_seed(seed: int | None, turn: int) -> int | None:
    """Tool turn `turn` of a rollout (design §5)."""
    return None if seed is None else seed + TURN_STRIDE * turn
