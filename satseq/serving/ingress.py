"""The team's ingress deployment: it checks a request, fans it out to every agent at once, and
votes on what comes back (design §7).

A request over a limit (problem characters, or prompt plus max_tokens over an agent's context)
gets 413 here, before any engine sees it. An agent that fails or misses the per-request
timeout drops out of the vote, and the response says `degraded: true`; only when no agent
answered is it an error: 504 if some agent timed out, 429 if every agent shed the request, else
503. An agent whose replica died is left out until Ray Serve has replaced it
(`satseq.serving.liveness`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI, HTTPException
from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle
from transformers import AutoConfig

from satseq.actors.trajectory import SamplingSpec
from satseq.config.schema import ServeConfig
from satseq.data import PromptFormat, prompt_ids
from satseq.evaluation.vote import TeamVote, team_vote
from satseq.model_trust import trusts
from satseq.models import load_tokenizer
from satseq.models.adapters import model_config_dir
from satseq.rewards import RewardScorer
from satseq.serving.agent import AgentAnswers
from satseq.serving.api import Health, PredictResponse, make_api
from satseq.serving.liveness import AgentLiveness, awaited
from satseq.serving.metrics import ServeMetrics
from satseq.serving.openai_api import openai_router

HEALTH_TIMEOUT_S = 5.0
TIMED_OUT = "timeout"  # how the reason of an agent that missed serve.timeout_s begins
SHED_RETRY_AFTER_S = 1  # the Retry-After of a 429: a queue slot frees within an engine call


@serve.deployment(max_ongoing_requests=256)
@serve.ingress()
class TeamIngress:
    def __init__(
        self,
        agents: dict[str, DeploymentHandle],
        agent_paths: dict[str, str],
        prompt_format: PromptFormat,
        scorer: RewardScorer,
        settings: ServeConfig,
    ) -> None:
        # By value, over gRPC straight to the agent's replica: a Ray actor call (by reference,
        # Serve's default) costs a few ms more per hop on a busy CPU.
        self.agents = {name: handle.options(_by_reference=False) for name, handle in agents.items()}
        self.tokenizers = {name: load_tokenizer(p) for name, p in agent_paths.items()}
        self.context_tokens = {  # a LoRA agent's: its base's
            name: AutoConfig.from_pretrained(
                model_config_dir(p), trust_remote_code=trusts(model_config_dir(p))
            ).max_position_embeddings
            for name, p in agent_paths.items()
        }
        self.prompt_format = prompt_format
        self.scorer = scorer
        self.settings = settings
        # Read in the replica's process: a RayService sets it on the pod (from a Secret).
        self.api_key = os.environ.get(settings.api_key_env or "") or None
        self.metrics = ServeMetrics()
        self.liveness = {
            name: AgentLiveness(name, handle, self.metrics.agent_up.labels(agent=name))
            for name, handle in self.agents.items()
        }

    def __serve_build_asgi_app__(self) -> FastAPI:
        app = make_api(self)
        app.include_router(openai_router(self))
        return app

    async def predict(
        self,
        problem: str,
        samples_per_agent: int,
        temperature: float,
        max_tokens: int,
        return_trajectories: bool = False,
    ) -> PredictResponse:
        started = time.perf_counter()
        prompts = self.agent_prompts(
            lambda tokenizer: prompt_ids(tokenizer, problem, self.prompt_format),
            len(problem),
            max_tokens,
        )
        spec = SamplingSpec(
            temperature=temperature, top_p=self.settings.top_p, max_new_tokens=max_tokens
        )
        answered, failed = await self.ask(prompts, samples_per_agent, spec)
        vote = await self.vote(answered)
        return PredictResponse(
            predicted_answer=vote.answer,
            individual_answers={name: a.answers for name, a in answered.items()},
            votes=vote.votes,
            agreement=vote.agreement,
            agents=list(answered),
            degraded=bool(failed),
            failed_agents=failed,
            latency_ms=(time.perf_counter() - started) * 1000,
            trajectories={name: a.trajectories for name, a in answered.items()}
            if return_trajectories
            else None,
        )

    def agent_prompts(
        self,
        encode: Callable[[Any], list[int]],
        characters: int,
        max_tokens: int,
        agents: Iterable[str] | None = None,
    ) -> dict[str, list[int]]:
        """Each agent's prompt, `encode(its tokenizer)` (every agent's, or `agents`'). 413
        before any engine sees it: text of `characters` over serve.max_problem_chars, or a
        prompt that with max_tokens exceeds its agent's context."""
        limit = self.settings.max_problem_chars
        if characters > limit:
            raise HTTPException(
                413,
                f"the text is {characters} characters; the limit is {limit} "
                "(serve.max_problem_chars)",
            )
        prompts = {name: encode(self.tokenizers[name]) for name in agents or self.tokenizers}
        for name, ids in prompts.items():
            if len(ids) + max_tokens > self.context_tokens[name]:
                raise HTTPException(
                    413,
                    f"the prompt is {len(ids)} tokens for agent {name!r}; with max_tokens "
                    f"{max_tokens} it exceeds the agent's context of {self.context_tokens[name]}",
                )
        return prompts

    async def ask(
        self, prompts: dict[str, list[int]], n: int, spec: SamplingSpec
    ) -> tuple[dict[str, AgentAnswers], dict[str, str]]:
        """n samples of each agent of `prompts`, all at once: (the answers of those that
        answered, why the others did not). None answered: 504 if one timed out, 429 if every
        one shed the request, else 503."""
        answered, failed = await self._ask_agents(prompts, n, spec)
        if not answered:
            raise no_answer_error(failed)
        for name, answers in answered.items():
            self.metrics.agent_generation.labels(agent=name).observe(answers.generation_s)
            self.metrics.agent_batch_size.labels(agent=name).observe(answers.batch_size)
        return answered, failed

    async def vote(self, answered: dict[str, AgentAnswers]) -> TeamVote:
        """The team's vote over every sample of `answered` (`team_vote`, off the event loop:
        math-verify is slow)."""
        vote = await asyncio.to_thread(
            team_vote,
            [answer for a in answered.values() for answer in a.answers],
            [logprob for a in answered.values() for logprob in a.logprobs],
            self.scorer.answers_equivalent,
        )
        self.metrics.agreement.observe(vote.agreement)
        return vote

    async def _ask_agents(
        self, prompts: dict[str, list[int]], n: int, spec: SamplingSpec
    ) -> tuple[dict[str, AgentAnswers], dict[str, str]]:
        """Every agent at once; returns (answers of those that answered in time, why the
        others did not)."""
        tasks = {
            name: asyncio.ensure_future(self._ask_agent(name, ids, n, spec))
            for name, ids in prompts.items()
        }
        await asyncio.wait(tasks.values(), timeout=self.settings.timeout_s)
        answered, failed = {}, {}
        for name, task in tasks.items():
            if not task.done():
                task.cancel()  # AgentLiveness.call cancels the agent's response
                failed[name] = f"{TIMED_OUT}: no answer within {self.settings.timeout_s:g} s"
            elif task.exception() is not None:
                failed[name] = _reason(task.exception())
            else:
                answered[name] = task.result()
        for name in failed:
            self.metrics.agent_failures.labels(agent=name).inc()
        return answered, failed

    async def _ask_agent(
        self, name: str, prompt: list[int], n: int, spec: SamplingSpec
    ) -> AgentAnswers:
        """One agent's answers; AgentDown at once while its replica is being replaced."""
        handle = self.agents[name]
        return await self.liveness[name].call(lambda: handle.answer.remote(prompt, n, spec, name))

    async def health(self) -> Health:
        async def ready(name: str) -> bool:
            if self.liveness[name].is_down:
                return False
            try:
                response = self.agents[name].ready.remote()
                return await asyncio.wait_for(awaited(response), HEALTH_TIMEOUT_S)
            except Exception:  # an agent that cannot answer is not ready, whatever the reason
                return False

        states = await asyncio.gather(*(ready(name) for name in self.agents))
        agents = dict(zip(self.agents, states, strict=True))
        return Health(status="ok" if all(states) else "unavailable", agents=agents)


def no_answer_error(failed: dict[str, str]) -> HTTPException:
    """Why no agent answered, as the HTTP error: 504 if one timed out; 429 if every one shed
    the request (its deployment's max_queued_requests was full: ask again later); else 503."""
    reasons = failed.values()
    if any(reason.startswith(TIMED_OUT) for reason in reasons):
        return HTTPException(504, f"no agent answered: {failed}")
    if all(reason.startswith(BackPressureError.__name__) for reason in reasons):
        return HTTPException(
            429,
            f"every agent is at capacity, try again later: {failed}",
            headers={"Retry-After": str(SHED_RETRY_AFTER_S)},
        )
    return HTTPException(503, f"no agent answered: {failed}")


def _reason(error: BaseException) -> str:
    """The first line of the agent's error, without Ray's wrapping traceback."""
    cause = getattr(error, "cause", None) or error
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[-1] if lines else 'no details'}"
