"""One agent of the served team: its engine behind a Ray Serve deployment (DESIGN §7).

`AgentModel` is the plain class (the benchmark calls it in-process); `AgentDeployment` serves
it, batching the requests that arrive together into as few engine calls as possible, and
running them off the replica's event loop so that health checks answer during generation.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ray import serve

from satseq.actors.engines import EngineKind, make_engine
from satseq.actors.trajectory import SamplingSpec
from satseq.models import load_tokenizer
from satseq.rewards import RewardScorer

AgentRequest = tuple[list[int], int, SamplingSpec]
"""(prompt token ids, number of samples, how to sample)."""

# Requests gathered into one engine call: bounded so that one batch's latency stays bounded.
MAX_BATCH_SIZE = 32
BATCH_WAIT_S = 0.005
# Serve's controller learns that a replica's process died from its next health check (the
# check's call fails at once), so the period (Serve's default: 10 s) bounds how long a dead
# replica goes unnoticed before its replacement starts. A live replica answers the check from
# its event loop (generation runs off it); one that misses three in a row is replaced.
HEALTH_CHECK_PERIOD_S = 1.0
HEALTH_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AgentAnswers:
    """An agent's n samples of one request: the extracted answers (None: no answer found),
    the samples' log-probabilities, and how long the engine call that made them took."""

    answers: list[str | None]
    logprobs: list[float | None]
    generation_s: float


class AgentModel:
    """One agent's engine on its HF model dir: prompt token ids in, extracted answers out."""

    def __init__(
        self,
        model_path: str,
        scorer: RewardScorer,
        engine: EngineKind = "hf",
        engine_options: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        self.engine = make_engine(engine, model_path, seed=seed, **(engine_options or {}))
        self.tokenizer = load_tokenizer(model_path)
        self.scorer = scorer

    def answer(self, requests: Sequence[AgentRequest]) -> list[AgentAnswers]:
        """answers[i] for requests[i]; one engine call per distinct (n, spec)."""
        groups: dict[tuple[int, SamplingSpec], list[int]] = defaultdict(list)
        for index, (_, n, spec) in enumerate(requests):
            groups[(n, spec)].append(index)
        results: list[AgentAnswers | None] = [None] * len(requests)
        for (n, spec), indices in groups.items():
            started = time.perf_counter()
            samples = self.engine.generate([requests[i][0] for i in indices], spec, n)
            elapsed = time.perf_counter() - started
            for index, generations in zip(indices, samples, strict=True):
                texts = [
                    self.tokenizer.decode(g.token_ids, skip_special_tokens=True)
                    for g in generations
                ]
                results[index] = AgentAnswers(
                    [self.scorer.extract_answer(text) for text in texts],
                    [g.logprob for g in generations],
                    elapsed,
                )
        return results

    def close(self) -> None:
        self.engine.close()


@serve.deployment(
    max_ongoing_requests=64,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
)
class AgentDeployment:
    """Serves one AgentModel. Scaling (num_replicas, autoscaling) comes from configs/serve.yaml."""

    def __init__(
        self,
        model_path: str,
        scorer: RewardScorer,
        engine: EngineKind,
        engine_options: dict[str, Any],
        seed: int,
    ) -> None:
        self.model = AgentModel(model_path, scorer, engine, engine_options, seed)

    async def ready(self) -> bool:
        return True

    async def answer(self, prompt_ids: list[int], n: int, spec: SamplingSpec) -> AgentAnswers:
        return await self._answer_batch((prompt_ids, n, spec))

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def _answer_batch(self, requests: list[AgentRequest]) -> list[AgentAnswers]:
        # serve.batch runs one batch at a time per replica, so the engine is never shared.
        return await asyncio.to_thread(self.model.answer, requests)
