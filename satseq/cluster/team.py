"""Who writes what: the team topologies' assignment of trajectories to agents (DESIGN §3)."""

from __future__ import annotations


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
