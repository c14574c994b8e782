"""What rollouts produce and learners consume: token ids with per-token ownership (design §3).

Plain dataclasses of Python lists, so they cross Ray's object store cheaply and unambiguously;
`pad_batch` turns a list of them into the [N, T] tensors the learner and `satseq.algo` use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from satseq.algo.masks import NO_OWNER


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample: the same spec goes to every engine so their outputs are comparable."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k; training keeps 0, since the learner's log-probs assume none
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()  # generation stops after any of these strings (e.g. "</code>")
    seed: int | None = None
    # Fill Generation.logprob (the vote's tie-break). Training never reads it, and the HF engine
    # would keep a [batch, vocab] logits tensor per generated token for it.
    logprobs: bool = True
    # Fill Generation.token_logprobs: each sampled token's log-prob under the distribution it was
    # sampled from (at the temperature); the off-policy weight of overlapped stages reads them.
    behaviour_logprobs: bool = False


@dataclass(frozen=True)
class Generation:
    """One engine sample: the new tokens and why generation ended ("stop" or "length").

    response_mask is None when every token was sampled by the model; a tool loop sets it to 0
    on the tool-output tokens it spliced in. logprob is the sum of the sampled tokens' log-probs
    when the engine reports it. meta carries per-sample facts such as the number of tool calls.
    """

    token_ids: list[int]
    finish_reason: str
    response_mask: list[int] | None = None
    # A float computed about the tokens, so it takes no part in comparing samples.
    logprob: float | None = field(default=None, compare=False)
    # Each token's log-prob under the sampling distribution (`SamplingSpec.behaviour_logprobs`);
    # 0 on tokens the model did not sample (tool output).
    token_logprobs: list[float] | None = field(default=None, compare=False)
    meta: dict = field(default_factory=dict)
    # Set by a rollout worker that scored the sample (a request with a Reference): its text
    # (special tokens skipped) and reward.
    text: str | None = None
    reward: float | None = None


class Reference(NamedTuple):
    """What a sample is scored against: the problem's text and its ground-truth answer."""

    problem: str
    answer: str


class GenerationRequest(NamedTuple):
    """n samples of `agent` from `prompt_ids`; with a reference, each sample comes back scored."""

    agent: str
    prompt_ids: list[int]
    n: int
    reference: Reference | None = None


GenerateFn = Callable[[list[GenerationRequest], SamplingSpec], list[list[Generation]]]
"""`(requests, spec) -> samples`, samples[r] the n Generations of requests[r]
(`RolloutWorker.generate`, or `spread_requests` over several rollout actors)."""


@dataclass
class Trajectory:
    """One complete response to one prompt, possibly written by several agents in turns.

    response_mask[t] is 1 for tokens a model wrote (trainable) and 0 for tokens it did not
    (tool output). owner_ids[t] is the team index of the agent that wrote token t, or NO_OWNER.
    """

    prompt_index: int  # which prompt of the stage's batch (the group id)
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    owner_ids: list[int]
    finish_reason: str
    response_text: str = ""
    reward: float = 0.0
    meta: dict = field(default_factory=dict)
    # log π_behaviour of each response token, the policy that sampled it, as its engine reported
    # (overlapped stages); None where not recorded
    behaviour_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if len(self.response_mask) != n or len(self.owner_ids) != n:
            raise ValueError(
                f"trajectory lengths disagree: {n} response ids, {len(self.response_mask)} mask "
                f"entries, {len(self.owner_ids)} owner ids"
            )


@dataclass(frozen=True)
class PaddedBatch:
    """Trajectories as right-padded tensors: input_ids = prompt ‖ response, left-aligned.

    input_ids, attention_mask [N, L]; response_start and response_lengths [N] are where each
    response begins and how many tokens it has; response_ids, response_mask, owner_ids [N, T]
    are aligned to the response (padded with 0 / 0 / NO_OWNER). Log-probs of response token t
    come from logits at position start + t − 1.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_start: torch.Tensor
    response_lengths: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    owner_ids: torch.Tensor

    def to(self, device: str | torch.device) -> PaddedBatch:
        """The same batch on `device` (tensors already there are not copied)."""
        return PaddedBatch(*(tensor.to(device) for tensor in vars(self).values()))


def pad_batch(trajectories: list[Trajectory], pad_token_id: int) -> PaddedBatch:
    """The trajectories as a PaddedBatch on the CPU (`.to(device)` moves it)."""
    L = max(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
    T = max(max(len(t.response_ids) for t in trajectories), 1)

    def rows(values, width: int, fill, dtype) -> torch.Tensor:
        padded = [list(v) + [fill] * (width - len(v)) for v in values]
        return torch.tensor(padded, dtype=dtype, device="cpu")

    sequences = [t.prompt_ids + t.response_ids for t in trajectories]
    return PaddedBatch(
        input_ids=rows(sequences, L, pad_token_id, torch.long),
        attention_mask=rows([[1] * len(s) for s in sequences], L, 0, torch.long),
        response_start=torch.tensor(
            [len(t.prompt_ids) for t in trajectories], dtype=torch.long, device="cpu"
        ),
        response_lengths=torch.tensor(
            [len(t.response_ids) for t in trajectories], dtype=torch.long, device="cpu"
        ),
        response_ids=rows([t.response_ids for t in trajectories], T, pad_token_id, torch.long),
        response_mask=rows([t.response_mask for t in trajectories], T, 0, torch.float32),
        owner_ids=rows([t.owner_ids for t in trajectories], T, NO_OWNER, torch.long),
    )
