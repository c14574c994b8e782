"""The Hugging Face engine: `model.generate` on the learner's own model class.

Slower than vLLM on big models, but it needs nothing beyond transformers, runs anywhere the
learner runs, and shares the learner's forward pass, so its log-probs match the learner's
exactly.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from satseq.actors.engines.base import (
    GREEDY_BELOW_TEMPERATURE,
    by_adapter,
    check_generate_request,
    check_logprob_request,
    set_cpu_threads,
)
from satseq.actors.forward import PolicyTrunk, response_logprobs
from satseq.actors.trajectory import (
    Generation,
    SamplingSpec,
    Trajectory,
    pad_batch,
)
from satseq.algo.logprobs import token_logprobs
from satseq.models import load_policy


class HFEngine:
    """One policy sampled with transformers' `generate`, in left-padded micro-batches.

    Options: `num_threads` (torch intra-op threads for this process), `max_batch_size`
    (sequences per `generate` call, which bounds memory), `device`, `fp32_head` (the output
    layer's matmul in float32 whatever the model's dtype, as the learner computes it),
    `adapters` (LoRA agent name → adapter directory on this base: a peft model with one adapter
    per agent; a call's `adapters` say which answers each prompt).

    Seeding: a call with `spec.seed` samples the whole call under `torch.manual_seed(spec.seed)`,
    so the same requests with the same seed give the same samples. A call without one takes its
    seed from a stream seeded by the engine's `seed`. The process's global RNG state is left as
    it was.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        num_threads: int = 1,
        max_batch_size: int = 64,
        device: str = "cpu",
        fp32_head: bool = True,
        adapters: dict[str, str] | None = None,
    ) -> None:
        set_cpu_threads(num_threads)
        self.model, self.tokenizer = load_policy(model_path, dtype, device)
        self.fp32_head = fp32_head
        if fp32_head:
            float32_output_layer(self.model)
        self.peft = None  # the peft model over `model` once an adapter is added
        for name, directory in (adapters or {}).items():
            self.add_adapter(name, directory)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.pad_token_id = self.tokenizer.pad_token_id
        self.eos_token_ids = _eos_token_ids(self.model.generation_config, self.tokenizer)
        # Drop the checkpoint's sampling defaults (top_k, repetition_penalty, ...): `generate`
        # would apply them to any setting a call leaves unset.
        self.model.generation_config = GenerationConfig(
            eos_token_id=self.eos_token_ids, pad_token_id=self.pad_token_id
        )
        self._seeds = random.Random(seed)

    def generate(
        self,
        prompts: list[list[int]],
        spec: SamplingSpec,
        n: int = 1,
        adapters: list[str | None] | None = None,
    ) -> list[list[Generation]]:
        check_generate_request(prompts, n)
        expanded = [prompt for prompt in prompts for _ in range(n)]
        adapter_of = None if adapters is None else [a for a in adapters for _ in range(n)]
        seed = spec.seed if spec.seed is not None else self._seeds.getrandbits(63)
        generations: list[Generation | None] = [None] * len(expanded)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for adapter, indices in by_adapter(adapter_of, len(expanded)).items():
                with self._active(adapter):
                    for first in range(0, len(indices), self.max_batch_size):
                        chunk = indices[first : first + self.max_batch_size]
                        batch = self._generate_batch([expanded[i] for i in chunk], spec)
                        for index, generation in zip(chunk, batch, strict=True):
                            generations[index] = generation
        return [generations[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], spec: SamplingSpec) -> list[Generation]:
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        stops = StopRecorder(self.tokenizer, width, spec.stop, self.eos_token_ids, len(prompts))
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=self._generation_config(spec),
                stopping_criteria=StoppingCriteriaList([stops]),
            )
        new_tokens = output.sequences[:, width:]
        # [batch, new tokens]: log π(token) at temperature 1, as vLLM's raw log-probs
        sampled_logprobs = (
            token_logprobs(torch.stack(output.logits, dim=1).float(), new_tokens).cpu()
            if spec.logprobs
            else None
        )
        # [batch, new tokens]: log π(token) under the distribution it was drawn from: the
        # scores after the temperature (and top_p), what `generate` sampled
        behaviour = (
            token_logprobs(torch.stack(output.scores, dim=1).float(), new_tokens).cpu()
            if spec.behaviour_logprobs
            else None
        )
        generations = []
        for row, (tokens, end) in enumerate(
            zip(new_tokens.tolist(), stops.stopped_at, strict=True)
        ):
            kept = len(tokens) if end is None else end
            logprob = (
                None if sampled_logprobs is None else float(sampled_logprobs[row, :kept].sum())
            )
            reason = "length" if end is None else "stop"
            generations.append(
                Generation(
                    tokens[:kept],
                    reason,
                    logprob=logprob,
                    token_logprobs=None if behaviour is None else behaviour[row, :kept].tolist(),
                )
            )
        return generations

    def _generation_config(self, spec: SamplingSpec) -> GenerationConfig:
        common = dict(
            max_new_tokens=spec.max_new_tokens,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            return_dict_in_generate=True,
            output_logits=spec.logprobs,  # raw logits, before temperature and top_p: `logprob`
            output_scores=spec.behaviour_logprobs,  # after them: `token_logprobs`
        )
        if spec.temperature < GREEDY_BELOW_TEMPERATURE:
            return GenerationConfig(do_sample=False, **common)
        # top_k=0 turns off transformers' default top-k of 50.
        return GenerationConfig(
            do_sample=True,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k,
            **common,
        )

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        unexpected = self.model.load_state_dict(weights, strict=False).unexpected_keys
        if unexpected:
            raise ValueError(f"the model has no weights named {unexpected[:5]}")

    # --- LoRA adapters (`satseq.actors.engines.lora`) -------------------------------------------

    def add_adapter(self, name: str, adapter_dir: str) -> None:
        """Adapter `name` from a PEFT adapter directory on this engine's base."""
        from peft import PeftModel

        if self.peft is None:  # peft adapts `model`'s layers in place
            self.peft = PeftModel.from_pretrained(self.model, adapter_dir, adapter_name=name)
        else:
            self.peft.load_adapter(adapter_dir, adapter_name=name)

    def can_add_adapter(self, adapter_dir: str) -> bool:
        return True  # peft holds any number, of any rank

    def load_adapter(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        """Adapter `name`'s tensors (PEFT-named, all or some) replaced in place."""
        from peft import set_peft_model_state_dict

        loaded = set_peft_model_state_dict(self.peft, weights, adapter_name=name)
        if loaded.unexpected_keys:
            raise ValueError(f"adapter {name!r} has no weights named {loaded.unexpected_keys[:5]}")

    def remove_adapter(self, name: str) -> None:
        if len(self.peft.peft_config) > 1:  # peft keeps its last adapter; the engine closes next
            self.peft.delete_adapter(name)

    @contextlib.contextmanager
    def _active(self, adapter: str | None) -> Iterator[None]:
        """Forward passes with `adapter` (None: the base alone)."""
        if self.peft is None and adapter is None:
            yield
        elif adapter is None:
            with self.peft.disable_adapter():
                yield
        else:
            self.peft.set_adapter(adapter)
            yield

    def prompt_logprobs(
        self,
        sequences: list[list[int]],
        start: list[int],
        temperature: float = 1.0,
        adapters: list[str | None] | None = None,
    ) -> list[list[float]]:
        check_logprob_request(sequences, start, temperature)
        result: list[list[float]] = [[] for _ in sequences]
        for adapter, indices in by_adapter(adapters, len(sequences)).items():
            with self._active(adapter):
                scored = self._prompt_logprobs(
                    [sequences[i] for i in indices], [start[i] for i in indices], temperature
                )
            for index, logprobs in zip(indices, scored, strict=True):
                result[index] = logprobs
        return result

    def _prompt_logprobs(
        self, sequences: list[list[int]], start: list[int], temperature: float
    ) -> list[list[float]]:
        trajectories = [
            Trajectory(
                prompt_index=i,
                prompt_ids=sequence[:first],
                response_ids=sequence[first:],
                response_mask=[1] * (len(sequence) - first),
                owner_ids=[0] * (len(sequence) - first),
                finish_reason="stop",
            )
            for i, (sequence, first) in enumerate(zip(sequences, start, strict=True))
        ]
        batch = pad_batch(trajectories, self.pad_token_id)
        with torch.inference_mode():
            logprobs = response_logprobs(
                PolicyTrunk(self.model, self.fp32_head), batch.to(self.device), temperature
            )
        return [logprobs[i, : len(t.response_ids)].tolist() for i, t in enumerate(trajectories)]

    def sleep(self) -> str:
        return "noop:hf"  # transformers has no sleep mode; the model stays where it is

    def wake_up(self) -> str:
        return "noop:hf"

    def close(self) -> None:
        self.model = None


def float32_output_layer(model: torch.nn.Module) -> None:
    """The model's output layer (lm_head) in float32, fed float32 hidden states: `generate`'s
    logits are then float32 matmuls, as the learner's (`trainer.fp32_head`). A tied output
    layer gets a float32 copy of the embedding (the input embedding stays in its dtype)."""
    head = model.get_output_embeddings()
    if head.weight.dtype == torch.float32:
        return
    untied = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    untied.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=False)
    if head.bias is not None:
        untied.bias = torch.nn.Parameter(head.bias.detach().float(), requires_grad=False)
    untied.register_forward_pre_hook(lambda _, args: (args[0].float(), *args[1:]))
    model.set_output_embeddings(untied.to(head.weight.device))


class StopRecorder(StoppingCriteria):
    """Stops each row of a batch at its first eos token or stop string, and records where.

    `stopped_at[row]` is the number of new tokens the row kept (its stopping token included),
    or None if it never stopped. `generate` pads finished rows up to the batch's longest, so
    this record, not the padding, says where each sample ends.

    Stop strings are matched on the decoded new text (special tokens skipped), as vLLM matches
    them. Rows are checked after every token, so a stop string is complete only on the step
    that writes its last byte; every token is at least one byte long, so the last
    `len(stop in bytes)` tokens always hold all of it and only those are decoded.
    """

    def __init__(
        self,
        tokenizer,
        prompt_width: int,
        stop: tuple[str, ...],
        eos_token_ids: list[int],
        batch_size: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompt_width = prompt_width
        self.stop = stop
        self.eos_token_ids = set(eos_token_ids)
        self.window = max((len(s.encode()) for s in stop), default=0)
        self.stopped_at: list[int | None] = [None] * batch_size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        """input_ids [batch, prompt_width + new tokens so far] -> is each row done, [batch]."""
        num_new = input_ids.shape[1] - self.prompt_width
        last_tokens = input_ids[:, -1].tolist()
        for row, stopped in enumerate(self.stopped_at):
            if stopped is None and (
                last_tokens[row] in self.eos_token_ids
                or self._ends_with_stop_string(input_ids[row])
            ):
                self.stopped_at[row] = num_new
        return torch.tensor(
            [stopped is not None for stopped in self.stopped_at], device=input_ids.device
        )

    def _ends_with_stop_string(self, row: torch.Tensor) -> bool:
        if not self.stop:
            return False
        first = max(self.prompt_width, row.shape[0] - self.window)
        text = self.tokenizer.decode(row[first:].tolist(), skip_special_tokens=True)
        return any(s in text for s in self.stop)


def _eos_token_ids(generation_config: GenerationConfig, tokenizer) -> list[int]:
    """The checkpoint's eos ids (generation_config and tokenizer), as vLLM collects them."""
    configured = generation_config.eos_token_id
    ids = [configured] if isinstance(configured, int) else list(configured or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the model has no eos token in its generation_config or tokenizer")
    return ids
