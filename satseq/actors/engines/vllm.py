"""The vLLM engine: a `vllm.LLM` living inside the calling process (the rollout actor's).

The engine core runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) rather than in a child
process, so that the learner's weights reach the model as Python objects, with no
serialisation and no second process per agent competing for the same cores.

Weight sync uses vLLM's own in-place reload (`Worker.reload_weights`): it rebuilds each layer
from the checkpoint-format tensors and reruns the layer's weight post-processing. That rerun
matters on CPU, where linear layers keep their weights only inside a prepacked oneDNN handle
(the `weight` parameter is emptied), so copying into parameters, or calling
`model.load_weights` directly, cannot update them. Tied embeddings need nothing special: the
reload skips `lm_head.weight` and the head reads the updated embedding. After a reload the
prefix cache is reset, since its KV blocks were computed with the old weights.
"""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path
from typing import Any

import torch
import vllm
from transformers import AutoConfig
from vllm.config import WeightTransferConfig
from vllm.platforms import current_platform
from vllm.v1.engine.core_client import InprocClient

from satseq.actors.engines.base import (
    GREEDY_BELOW_TEMPERATURE,
    by_adapter,
    check_generate_request,
    check_logprob_request,
    set_cpu_threads,
)
from satseq.actors.engines.vllm_lora import VLLMAdapters, lora_options
from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.actors.weight_transfer import TransferBackend
from satseq.model_trust import trusts
from satseq.models import resolve_model_path
from satseq.seeds import call_seed

# What works on a few CPU cores: no graph compilation (it costs minutes of start-up and needs
# Triton), and an explicit KV-cache size (vLLM's default reserves a fraction of all RAM).
CPU_DEFAULTS: dict[str, Any] = {"enforce_eager": True, "kv_cache_memory_bytes": 256 << 20}
# vLLM refuses to start unless the KV cache holds one sequence of the model's full length, and
# real models declare long ones (SmolLM2: 8192 tokens, 0.35 GiB of float32 KV cache). On CPU
# sequences are capped at this many tokens (or the model's own limit, if lower): far more than
# a rollout's prompt and response, and within CPU_DEFAULTS' cache for models up to ~64 KiB of
# KV per token.
CPU_MAX_MODEL_LEN = 4096

# vLLM keeps its distributed state (process groups) in module globals that every engine of a
# process shares, and an engine's shutdown destroys them. So only the last engine to close
# may shut down fully; the others just let go of their model and caches.
_open_engines: weakref.WeakSet[VLLMEngine] = weakref.WeakSet()


class VLLMEngine:
    """One policy served by an in-process `vllm.LLM`.

    Options: `num_threads` (torch threads of this process, on CPU), `fp32_head` (the output
    layer in float32, vLLM's `head_dtype` for generation models: the learner computes its
    logits so, `trainer.fp32_head`), and any `vllm.LLM` argument (`max_model_len`,
    `kv_cache_memory_bytes`, `gpu_memory_utilization`, ...), which override CPU_DEFAULTS.

    With `adapters` (LoRA agent name → adapter directory on this base) the engine serves each
    agent's adapter through vLLM's multi-LoRA (`satseq.actors.engines.vllm_lora`); a call's
    `adapters` say which answers each prompt.

    Seeding: `LLM(seed=seed)` seeds the engine's sampling stream. A call with `spec.seed`
    samples prompt i with its own generator seeded `spec.seed + i`, so the same requests with
    the same seed give the same samples whatever else the engine is doing.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        seed: int = 0,
        num_threads: int = 1,
        weight_transfer: TransferBackend | None = None,
        fp32_head: bool = True,
        adapters: dict[str, str] | None = None,
        **llm_options: Any,
    ) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        model_dir = resolve_model_path(model_path)
        options: dict[str, Any] = {
            # prompt_logprobs at a temperature ≠ 1 needs the whole vocabulary's log-probs
            "max_logprobs": -1,
            **(_cpu_defaults(model_dir) if current_platform.is_cpu() else {}),
            **({"hf_overrides": {"head_dtype": "float32"}} if fp32_head else {}),
            **(lora_options(list(adapters.values())) if adapters else {}),
            **llm_options,
        }
        if weight_transfer is not None:  # a collective weight sync (`receive_weights`)
            from satseq.actors.engines.vllm_transfer import VLLM_BACKENDS

            backend = VLLM_BACKENDS[weight_transfer]
            options["weight_transfer_config"] = WeightTransferConfig(backend=backend)
        self.transfer_open = False
        if current_platform.is_cpu():
            set_cpu_threads(num_threads)
        real_set_num_threads = torch.set_num_threads
        try:
            self.llm = vllm.LLM(
                model=str(model_dir),
                dtype=dtype,
                seed=seed,
                trust_remote_code=trusts(model_dir),
                **options,
            )
        finally:
            # vLLM's CPU worker swaps torch.set_num_threads for a no-op, meant for worker
            # processes whose threads it pinned to cores. This engine runs unpinned in the
            # caller's process, which keeps control of its threads.
            torch.set_num_threads = real_set_num_threads
        if not isinstance(self.llm.llm_engine.engine_core, InprocClient):
            raise RuntimeError(
                "vLLM started its engine core in a child process although "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 was set; an earlier vLLM engine in this "
                "process probably read the variable first. Weight sync needs the engine in "
                "this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before any vLLM engine starts."
            )
        # the sampled tokens' log-probs are the sampling distribution's (temperature applied)
        self.processed_logprobs = options.get("logprobs_mode") == "processed_logprobs"
        # vLLM sleeps on CUDA only, and only when built for it (engine option enable_sleep_mode)
        self.can_sleep = (
            current_platform.is_cuda()
            and hasattr(self.llm, "sleep")
            and bool(options.get("enable_sleep_mode"))
        )
        _open_engines.add(self)
        self.lora: VLLMAdapters | None = None
        if adapters:
            self.lora = VLLMAdapters(self.llm, options["max_loras"], options["max_lora_rank"])
            for name, directory in adapters.items():
                self.lora.add(name, directory)

    def generate(
        self,
        prompts: list[list[int]],
        spec: SamplingSpec,
        n: int = 1,
        adapters: list[str | None] | None = None,
    ) -> list[list[Generation]]:
        check_generate_request(prompts, n)
        greedy = spec.temperature < GREEDY_BELOW_TEMPERATURE
        # Greedy samples are all the same and vLLM refuses n > 1 with greedy: draw one, copy it.
        copies = n if greedy else 1
        params = [
            vllm.SamplingParams(
                n=n // copies,
                temperature=0.0 if greedy else spec.temperature,
                top_p=spec.top_p,
                top_k=spec.top_k,  # 0: off, as in SamplingSpec
                max_tokens=spec.max_new_tokens,
                stop=list(spec.stop),
                seed=call_seed(spec.seed, i),
                # the sampled token's log-prob only: raw for `Generation.logprob`, or with
                # logprobs_mode "processed_logprobs" under the sampling distribution, for
                # `Generation.token_logprobs`
                logprobs=0 if spec.logprobs or spec.behaviour_logprobs else None,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            _token_prompts(prompts),
            params,
            use_tqdm=False,
            lora_request=self._lora_requests(adapters, len(prompts)),
        )
        if spec.behaviour_logprobs and not self.processed_logprobs:
            raise ValueError(
                "behaviour log-probs need a vLLM engine started with logprobs_mode "
                "'processed_logprobs' (the engine option overlapped stages set)"
            )
        return [
            [
                Generation(
                    list(sample.token_ids),
                    sample.finish_reason,
                    logprob=sample.cumulative_logprob,
                    token_logprobs=_sampled_logprobs(sample) if spec.behaviour_logprobs else None,
                )
                for sample in output.outputs
            ]
            * copies
            for output in outputs
        ]

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        # In-process, collective_rpc hands the iterator to the worker as it is.
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(weights.items())}
        )
        self.llm.reset_prefix_cache()

    # --- LoRA adapters (`satseq.actors.engines.lora`) -------------------------------------------

    def add_adapter(self, name: str, adapter_dir: str) -> None:
        self._adapters().add(name, adapter_dir)

    def can_add_adapter(self, adapter_dir: str) -> bool:
        return self.lora is not None and self.lora.can_add(adapter_dir)

    def load_adapter(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        """A push: agent `name`'s adapter as a new version (`VLLMAdapters.load`)."""
        self._adapters().load(name, weights)

    def remove_adapter(self, name: str) -> None:
        self._adapters().remove(name)

    def _adapters(self) -> VLLMAdapters:
        if self.lora is None:
            raise ValueError("this vLLM engine was started without adapters (enable_lora)")
        return self.lora

    def _lora_requests(self, adapters: list[str | None] | None, count: int) -> list | None:
        """Each prompt's LoRARequest (None: the base's), or None where no prompt has one."""
        groups = by_adapter(adapters, count)
        if list(groups) == [None]:
            return None
        return [self._adapters().request(adapter) for adapter in adapters]

    def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Join the learner's weight-transfer group (`satseq.actors.weight_transfer`), leaving
        the group of an earlier learner first."""
        if self.transfer_open:
            self.llm.collective_rpc("shutdown_weight_transfer_engine")
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})
        self.transfer_open = True

    def receive_weights(self, update_info: dict[str, Any]) -> None:
        """Take the weights the learner broadcasts now (vLLM's update lifecycle: every layer
        reloaded once its weights are in), then drop the prefix cache."""
        self.llm.collective_rpc("start_weight_update")
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})
        self.llm.collective_rpc("finish_weight_update")
        self.llm.reset_prefix_cache()

    def prompt_logprobs(
        self,
        sequences: list[list[int]],
        start: list[int],
        temperature: float = 1.0,
        adapters: list[str | None] | None = None,
    ) -> list[list[float]]:
        """See `Engine.prompt_logprobs`.

        vLLM scores prompt tokens at temperature 1 only. For another temperature this asks for
        the log-probs of the whole vocabulary, z − logsumexp(z), and renormalises them after
        dividing by the temperature (the logsumexp shift cancels in the softmax): exact, but
        it builds vocab-size dicts per token, so keep it to small vocabularies and checks.
        """
        check_logprob_request(sequences, start, temperature)
        whole_vocabulary = temperature != 1.0
        params = vllm.SamplingParams(
            max_tokens=1, prompt_logprobs=-1 if whole_vocabulary else 0, detokenize=False
        )
        outputs = self.llm.generate(
            _token_prompts(sequences),
            params,
            use_tqdm=False,
            lora_request=self._lora_requests(adapters, len(sequences)),
        )
        result = []
        for output, sequence, first in zip(outputs, sequences, start, strict=True):
            positions = output.prompt_logprobs[first:]
            targets = sequence[first:]
            if whole_vocabulary:
                result.append(_at_temperature(positions, targets, temperature))
            else:
                result.append(
                    [
                        scores[token].logprob
                        for scores, token in zip(positions, targets, strict=True)
                    ]
                )
        return result

    def sleep(self) -> str:
        """Level 1: the weights go to host memory, the KV cache is dropped (`Engine.sleep`)."""
        if not self.can_sleep:
            return f"noop:{current_platform.device_type}"
        self.llm.sleep(level=1)
        return f"vllm.sleep(level=1):{current_platform.device_type}"

    def wake_up(self) -> str:
        if not self.can_sleep:
            return f"noop:{current_platform.device_type}"
        self.llm.wake_up()
        return f"vllm.wake_up():{current_platform.device_type}"

    def close(self) -> None:
        if self not in _open_engines:
            return
        _open_engines.discard(self)
        if self.lora is not None:
            self.lora.close()
        client = self.llm.llm_engine.engine_core
        if _open_engines:
            # Keep the shared process groups alive for the other engines: skip the shutdown
            # (which would run when the client is collected, too) and undo the gc.freeze() the
            # engine did at start-up, so its model and caches can be collected.
            client._finalizer.detach()
            gc.unfreeze()
        else:
            client.shutdown()
        del self.llm
        gc.collect()


def _cpu_defaults(model_dir: Path) -> dict[str, Any]:
    """CPU_DEFAULTS, and a maximum sequence length of CPU_MAX_MODEL_LEN tokens or the model's
    own limit, whichever is lower."""
    text_config = AutoConfig.from_pretrained(
        model_dir, trust_remote_code=trusts(model_dir)
    ).get_text_config()
    model_limit = getattr(text_config, "max_position_embeddings", None) or CPU_MAX_MODEL_LEN
    return {**CPU_DEFAULTS, "max_model_len": min(CPU_MAX_MODEL_LEN, model_limit)}


def _token_prompts(prompts: list[list[int]]) -> list[vllm.TokensPrompt]:
    return [vllm.TokensPrompt(prompt_token_ids=prompt) for prompt in prompts]


def _at_temperature(positions, targets: list[int], temperature: float) -> list[float]:
    """log softmax(logp / T)[target] at each position, from whole-vocabulary log-probs."""
    result = []
    for scores, target in zip(positions, targets, strict=True):
        token_ids = torch.tensor(list(scores.keys()))
        logp = torch.tensor([entry.logprob for entry in scores.values()], dtype=torch.float32)
        tempered = torch.log_softmax(logp / temperature, dim=-1)
        result.append(tempered[token_ids == target].item())
    return result


def _sampled_logprobs(sample: Any) -> list[float]:
    """Each sampled token's log-prob, as vLLM reported it (`sample.logprobs[t]` maps the sampled
    token, and any others asked for, to their Logprob)."""
    return [
        position[token].logprob
        for token, position in zip(sample.token_ids, sample.logprobs, strict=True)
    ]
