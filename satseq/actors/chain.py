"""The `chain` team topology (DESIGN §3): agents take turns on one growing token sequence.

Agent k's context is the problem and every earlier turn, joined by handoff tokens (a role
prompt in the chat format). Every token records its writer: a turn's tokens are owned by its
agent and trained on; handoff tokens are owned by no one (NO_OWNER) and masked out.
"""

from __future__ import annotations

from collections.abc import Callable

from satseq.actors.trajectory import Generation, SamplingSpec, Trajectory
from satseq.algo.masks import NO_OWNER

GenerateFn = Callable[[list[tuple[str, list[int], int]], SamplingSpec], list[list[Generation]]]


def chain_rollouts(
    generate: GenerateFn,
    prompt_ids: list[list[int]],
    agents: list[str],
    handoff_ids: list[list[int]],
    group_size: int,
    spec: SamplingSpec,
) -> list[Trajectory]:
    """G chains per prompt, prompt-major. handoff_ids[k] precedes agent k's turn (k ≥ 1).

    generate(requests, spec) takes (agent, prompt ids, n) requests and returns their samples.
    Each trajectory's `meta["turn_bounds"]` holds the (start, end) of each turn in the response.
    """
    chains = [
        Trajectory(p, list(ids), [], [], [], "stop", meta={"turn_bounds": []})
        for p, ids in enumerate(prompt_ids)
        for _ in range(group_size)
    ]
    for k, agent in enumerate(agents):
        if k > 0:
            for chain in chains:
                _extend(chain, handoff_ids[k], owner=NO_OWNER, mask=[0] * len(handoff_ids[k]))
        samples = generate([(agent, c.prompt_ids + c.response_ids, 1) for c in chains], spec)
        for chain, (sample,) in zip(chains, samples, strict=True):
            start = len(chain.response_ids)
            n = len(sample.token_ids)  # tool output inside a turn stays masked out
            _extend(chain, sample.token_ids, owner=k, mask=sample.response_mask or [1] * n)
            chain.meta["turn_bounds"].append((start, len(chain.response_ids)))
            chain.finish_reason = sample.finish_reason
    return chains


def _extend(chain: Trajectory, token_ids: list[int], owner: int, mask: list[int]) -> None:
    chain.response_ids.extend(token_ids)
    chain.owner_ids.extend([owner] * len(token_ids))
    chain.response_mask.extend(mask)
