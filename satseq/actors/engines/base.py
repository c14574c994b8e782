"""The one interface every rollout engine implements, and the checks every engine shares.

An engine holds one policy (one agent's weights) and does three things with it: sample
continuations of token-id prompts, take new weights from the learner in place, and score
given tokens teacher-forced (for checks that the engine and the learner agree). An engine on a
base model with LoRA adapters (`adapters=`) holds one policy per adapter: LoRA agents share it
through `satseq.actors.engines.lora`. When the team
shares its GPUs with the learners (`trainer.offload: idle_agents`) it also sleeps while they
train.
"""

from __future__ import annotations

import os
from typing import Literal, Protocol

import torch

from satseq.actors.trajectory import Generation, SamplingSpec

GREEDY_BELOW_TEMPERATURE = 1e-5
"""A temperature below this decodes greedily in every engine (vLLM's _SAMPLING_EPS): a tiny
positive temperature would otherwise divide the logits into inf."""

EngineKind = Literal["hf", "vllm"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("hf", "vllm")


class Engine(Protocol):
    """A policy that samples, takes the learner's weights, and scores tokens.

    Sampling draws from the model's softmax(logits / temperature) restricted to the top_p
    nucleus, and nothing else (no top-k, no repetition penalty, whatever the checkpoint's
    generation_config says), because the learner's behaviour log-probs assume exactly that.
    """

    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, n: int = 1
    ) -> list[list[Generation]]:
        """`n` samples for each prompt: result[i][j] is prompt i's j-th sample.

        `Generation.token_ids` holds the new tokens only, never the prompt. It ends with the
        token that stopped generation when there is one: the eos token, or the token that
        completed a stop string (that token is kept whole, so it may carry text past the stop
        string). finish_reason is "stop" for those, "length" when `spec.max_new_tokens` new
        tokens were written first. `spec.temperature == 0` means greedy decoding.
        """
        ...

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Replace the named weights of the policy in place with `weights`, named as in the
        learner's `model.state_dict()` (Hugging Face names, CPU tensors): all of them or one
        bucket of a streamed sync (`Learner.weight_buckets`); the others stay. Later calls
        sample from the new weights only."""
        ...

    def prompt_logprobs(
        self, sequences: list[list[int]], start: list[int], temperature: float = 1.0
    ) -> list[list[float]]:
        """log π(sequences[i][t] | sequences[i][:t]) at `temperature` for t ≥ start[i] ≥ 1.

        result[i] has len(sequences[i]) − start[i] entries. This is the learner's
        teacher-forced view of the same tokens, for parity checks and benchmarks; the training
        loop takes its behaviour log-probs from the learner (design §4), never from here.
        """
        ...

    def sleep(self) -> str:
        """Free the engine's accelerator memory (weights and KV cache) until `wake_up`, where the
        engine can; no `generate` nor `load_weights` in between. Returns what ran where, e.g.
        "vllm.sleep(level=1):cuda", or "noop:<why>" where there is nothing to free."""
        ...

    def wake_up(self) -> str:
        """Take back what `sleep` freed, with the weights the engine had. Returns what ran."""
        ...

    def close(self) -> None:
        """Release the engine's model and caches; the engine is unusable afterwards."""
        ...


def set_cpu_threads(num_threads: int) -> None:
    """Give this process's torch `num_threads` intra-op threads.

    Rollout actors, learners and sandboxes share a few cores, so engines default to one thread
    each instead of torch's one per core. OMP_NUM_THREADS is set too because vLLM's CPU worker
    forces torch down to one thread unless that variable says otherwise.
    """
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    os.environ["OMP_NUM_THREADS"] = str(num_threads)
    torch.set_num_threads(num_threads)


def by_adapter(adapters: list[str | None] | None, count: int) -> dict[str | None, list[int]]:
    """The indices of `count` requests by the LoRA adapter each asks for (None: the base), in
    first-seen order (`adapters` None: all the base's)."""
    if adapters is not None and len(adapters) != count:
        raise ValueError(f"{len(adapters)} adapters for {count} requests")
    groups: dict[str | None, list[int]] = {}
    for index, adapter in enumerate(adapters or [None] * count):
        groups.setdefault(adapter, []).append(index)
    return groups


def check_generate_request(prompts: list[list[int]], n: int) -> None:
    """Raise ValueError for a `generate` call no engine can answer."""
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be at least 1, got {n}")
    if any(not prompt for prompt in prompts):
        raise ValueError("every prompt needs at least one token")


def check_logprob_request(sequences: list[list[int]], start: list[int], temperature: float) -> None:
    """Raise ValueError, saying which sequence, for a `prompt_logprobs` call no engine can
    answer."""
    if len(sequences) != len(start):
        raise ValueError(f"{len(sequences)} sequences but {len(start)} start positions")
    if temperature <= 0:
        raise ValueError(f"log-probs need a temperature > 0, got {temperature}")
    for i, (sequence, first) in enumerate(zip(sequences, start, strict=True)):
        if not 1 <= first <= len(sequence):
            raise ValueError(
                f"sequence {i}: start {first} is outside [1, {len(sequence)}] (the first token "
                "has no prefix to be scored on)"
            )
