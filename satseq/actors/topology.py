"""The team topologies (design §3): who writes which tokens of a trajectory.

- `mixture`: each trajectory is one agent's answer to the raw prompt; `mixture_assignment` deals
  the G samples of each prompt to the agents, and `owner_rollouts` samples them.
- `chain`: agents take turns on one growing token sequence (`chain_rollouts`). Agent k's context
  is the problem and every earlier turn, joined by handoff tokens (a role prompt in the chat
  format). Handoff tokens are owned by no one (NO_OWNER) and masked out.

Every token records its writer. Requests carry the problem's reference answer, so the rollout
workers return each scored sample with its text and reward (design §3 step 3).
"""

from __future__ import annotations

from collections.abc import Callable

from satseq.actors.trajectory import (
    GenerateFn,
    GenerationRequest,
    Reference,
    SamplingSpec,
    Trajectory,
)
from satseq.algo.masks import NO_OWNER


def mixture_assignment(
    num_prompts: int, group_size: int, n_agents: int, first_prompt: int
) -> list[list[int]]:
    """Agent index of each of the G samples of each prompt, [num_prompts][G].

    Agents are assigned round-robin across the G samples with an offset that rotates per
    prompt (prompt p starts at agent (first_prompt + p) mod n), as in the official SAT code.
    """
    return [
        [(first_prompt + p + j) % n_agents for j in range(group_size)] for p in range(num_prompts)
    ]


def owner_rollouts(
    generate: GenerateFn,
    agents: list[str],
    prompt_ids: Callable[[int, int], list[int]],
    owners: list[list[int]],
    references: list[Reference],
    spec: SamplingSpec,
) -> list[Trajectory]:
    """One scored trajectory per entry of owners[p] (the agent that answers prompt p), in order.

    Each agent answers the raw prompt on its own: one request per (prompt, agent) with n = that
    agent's share of the prompt's samples. prompt_ids(p, a) is agent a's prompt for prompt p.
    """
    keys = [(p, a) for p in range(len(owners)) for a in sorted(set(owners[p]))]
    ids = {(p, a): prompt_ids(p, a) for p, a in keys}
    requests = [
        GenerationRequest(agents[a], ids[p, a], owners[p].count(a), references[p]) for p, a in keys
    ]
    samples = dict(zip(keys, generate(requests, spec), strict=True))
    trajectories = []
    for p in range(len(owners)):
        for a in owners[p]:
            sample = samples[p, a].pop(0)
            n = len(sample.token_ids)
            trajectories.append(
                Trajectory(
                    p,
                    ids[p, a],
                    list(sample.token_ids),
                    list(sample.response_mask or [1] * n),  # tool output is masked out
                    [a] * n,
                    sample.finish_reason,
                    sample.text,
                    sample.reward,
                    meta=dict(sample.meta),
                    behaviour_logprobs=sample.token_logprobs,
                )
            )
    return trajectories


def chain_rollouts(
    generate: GenerateFn,
    prompt_ids: list[list[int]],
    agents: list[str],
    handoff_ids: list[list[int]],
    group_size: int,
    spec: SamplingSpec,
    references: list[Reference] | None = None,
) -> list[Trajectory]:
    """G chains per prompt, prompt-major. handoff_ids[k] precedes agent k's turn (k ≥ 1).

    The last turn is scored against references[p]: its text and reward are the trajectory's.
    Each trajectory's `meta["turn_bounds"]` holds the (start, end) of each turn in the response.
    """
    chains = [
        Trajectory(
            p, list(ids), [], [], [], "stop", meta={"turn_bounds": []}, behaviour_logprobs=[]
        )
        for p, ids in enumerate(prompt_ids)
        for _ in range(group_size)
    ]
    last = len(agents) - 1
    for k, agent in enumerate(agents):
        if k > 0:
            for chain in chains:
                handoff = handoff_ids[k]
                _extend(chain, handoff, NO_OWNER, [0] * len(handoff), [0.0] * len(handoff))
        requests = [
            GenerationRequest(
                agent,
                c.prompt_ids + c.response_ids,
                1,
                references[c.prompt_index] if references is not None and k == last else None,
            )
            for c in chains
        ]
        for chain, (sample,) in zip(chains, generate(requests, spec), strict=True):
            start = len(chain.response_ids)
            n = len(sample.token_ids)  # tool output inside a turn stays masked out
            mask = sample.response_mask or [1] * n
            _extend(chain, sample.token_ids, k, mask, sample.token_logprobs or [0.0] * n)
            chain.meta["turn_bounds"].append((start, len(chain.response_ids)))
            chain.finish_reason = sample.finish_reason
            if k == last and sample.text is not None:
                chain.response_text, chain.reward = sample.text, sample.reward
    return chains


def _extend(
    chain: Trajectory, token_ids: list[int], owner: int, mask: list[int], logprobs: list[float]
) -> None:
    chain.response_ids.extend(token_ids)
    chain.owner_ids.extend([owner] * len(token_ids))
    chain.response_mask.extend(mask)
    chain.behaviour_logprobs.extend(logprobs)
