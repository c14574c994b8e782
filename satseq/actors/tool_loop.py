"""The tool-augmented agent loop (design §5): the model writes code, the sandbox runs it, the
output goes back into the response, and the model continues.

Each sample is a small state machine:

    PENDING → GENERATING → PROCESSING_TOOLS → GENERATING → … → TERMINATED

- GENERATING: the engine continues prompt + response so far and stops at `</code>`.
- PROCESSING_TOOLS: every `<code>` block of that turn runs in the sandbox (concurrently, with
  all other samples' blocks); the outputs are appended, in order, as `<interpreter>` text with
  response_mask 0, because the model did not write them.
- TERMINATED: a turn without code, `max_turns` model turns (a code block in the last turn is
  left unrun: no turn follows to read its output), or the response budget spent.

`spec.max_new_tokens` bounds the whole response, model and tool tokens together; a response
cut by it ends with finish_reason "length". Each turn, all still-active samples go to the engine
in one call, so the engine batches them.

    loop = ToolLoop(engine, tokenizer, SandboxClient(pool_actor), ToolConfig(enabled=True))
    generations = loop.generate([prompt_ids], SamplingSpec(max_new_tokens=256), counts=[4])
    generations[0][0].meta  # {"tool_calls": 1, "turns": 2, "tool_statuses": ["ok"]}
    tool_turns(generations[0][0], tokenizer.decode)  # [ToolTurn(text, code, interpreter), ...]
    tool_usage([g.meta["tool_calls"] for g in samples], pool_metrics["statuses"])
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from satseq.actors.engines import Engine
from satseq.actors.tool_text import (
    CODE_CLOSE,
    code_blocks,
    failure_observation,
    interpreter_text,
    observation,
    print_last_expression,
)
from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.config.rollout import ToolConfig
from satseq.sandbox.types import ExecutionRequest, ExecutionResult, Status
from satseq.seeds import turn_seed


class SandboxClient:
    """Runs a batch of requests concurrently on a sandbox and never raises for one of them.

    `sandbox` is a `SandboxPool` Ray actor handle, or anything in this process with an
    `async execute(ExecutionRequest) -> ExecutionResult` (a `SandboxPool`, a backend). The
    in-process kind runs on an event loop this client owns, kept across calls because a
    `SandboxPool`'s workers live on the loop that first used it.
    """

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self._is_actor = isinstance(sandbox, ray.actor.ActorHandle)
        self._loop = None if self._is_actor else asyncio.new_event_loop()

    def execute_all(self, requests: list[ExecutionRequest]) -> list[ExecutionResult | Exception]:
        """result[i] answers requests[i]: the sandbox's result, or the exception that kept the
        sandbox from answering (a dead pool actor, a backend that raised)."""
        if not requests:
            return []
        if self._is_actor:
            return [_result_or_error(ref) for ref in self._submit(requests)]
        return self._loop.run_until_complete(self._execute_concurrently(requests))

    async def _execute_concurrently(
        self, requests: list[ExecutionRequest]
    ) -> list[ExecutionResult | Exception]:
        runs = (self.sandbox.execute(request) for request in requests)
        return await asyncio.gather(*runs, return_exceptions=True)

    def _submit(self, requests: list[ExecutionRequest]) -> list[ray.ObjectRef | Exception]:
        refs: list[ray.ObjectRef | Exception] = []
        for request in requests:
            try:
                refs.append(self.sandbox.execute.remote(request))
            except Exception as error:  # the actor is gone before the call is even queued
                refs.append(error)
        return refs

    def close(self) -> None:
        """Stop what still runs on this client's loop (an in-process pool's workers); the
        sandbox itself belongs to the caller."""
        if self._loop is None or self._loop.is_closed():
            return
        self._loop.run_until_complete(_cancel_all_tasks())
        self._loop.close()


async def _cancel_all_tasks() -> None:
    pending = asyncio.all_tasks() - {asyncio.current_task()}
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _result_or_error(ref: ray.ObjectRef | Exception) -> ExecutionResult | Exception:
    if isinstance(ref, Exception):
        return ref
    try:
        return ray.get(ref)
    except Exception as error:
        return error


class SampleState(enum.Enum):
    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


@dataclass
class ToolRollout:
    """One sample's response as it grows over turns."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: the model's token, 0: a tool's
    state: SampleState = SampleState.PENDING
    finish_reason: str = "stop"
    turns: int = 0
    code: list[str] = field(default_factory=list)  # the blocks waiting for the sandbox
    tool_statuses: list[str] = field(default_factory=list)
    # The sum over the model's tokens, while every turn's engine reported it for all it kept.
    logprob: float | None = 0.0
    # Each token's log-prob under the sampling distribution (0 on tool output), when asked for.
    token_logprobs: list[float] | None = None

    def append(
        self, token_ids: list[int], written_by_model: bool, logprobs: list[float] | None = None
    ) -> None:
        self.response_ids.extend(token_ids)
        self.response_mask.extend([int(written_by_model)] * len(token_ids))
        if self.token_logprobs is not None:
            self.token_logprobs.extend(logprobs or [0.0] * len(token_ids))

    def terminate(self, finish_reason: str) -> None:
        self.state = SampleState.TERMINATED
        self.finish_reason = finish_reason
        self.code = []

    def generation(self) -> Generation:
        return Generation(
            self.response_ids,
            self.finish_reason,
            response_mask=self.response_mask,
            logprob=self.logprob,
            token_logprobs=self.token_logprobs,
            meta={
                "tool_calls": len(self.tool_statuses),
                "turns": self.turns,
                "tool_statuses": self.tool_statuses,
            },
        )


class ToolLoop:
    """Runs the agent loop for one agent's engine; see the module docstring.

    A final expression statement's value is printed, as a REPL shows it
    (`tool_text.print_last_expression`).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        sandbox: SandboxClient,
        config: ToolConfig,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.sandbox = sandbox
        self.config = config

    def generate(
        self, prompts: list[list[int]], spec: SamplingSpec, counts: list[int]
    ) -> list[list[Generation]]:
        """counts[i] samples for prompts[i]: result[i][j] is prompt i's j-th sample."""
        rollouts = [
            ToolRollout(list(prompt), token_logprobs=[] if spec.behaviour_logprobs else None)
            for prompt, n in zip(prompts, counts, strict=True)
            for _ in range(n)
        ]
        stop = spec.stop if CODE_CLOSE in spec.stop else (*spec.stop, CODE_CLOSE)
        for rollout in rollouts:
            rollout.state = SampleState.GENERATING
        for turn in range(self.config.max_turns):
            active = [r for r in rollouts if r.state is SampleState.GENERATING]
            if not active:
                break
            seed = turn_seed(spec.seed, turn)
            self._generate_turn(active, replace(spec, stop=stop, seed=seed))
            self._process_tools(
                [r for r in active if r.state is SampleState.PROCESSING_TOOLS], spec
            )
        results, first = [], 0
        for n in counts:
            results.append([r.generation() for r in rollouts[first : first + n]])
            first += n
        return results

    def _generate_turn(self, active: list[ToolRollout], spec: SamplingSpec) -> None:
        """GENERATING → PROCESSING_TOOLS or TERMINATED, for all of `active` in one engine call.

        The call may write as many tokens as the sample with the most budget left; each sample
        keeps only what its own budget allows (a prefix of a sample is a sample of that length).
        """
        budgets = [spec.max_new_tokens - len(r.response_ids) for r in active]
        samples = self.engine.generate(
            [r.prompt_ids + r.response_ids for r in active],
            replace(spec, max_new_tokens=max(budgets)),
            1,
        )
        for rollout, budget, (sample,) in zip(active, budgets, samples, strict=True):
            logprobs = sample.token_logprobs[:budget] if sample.token_logprobs else None
            rollout.append(sample.token_ids[:budget], True, logprobs)
            rollout.turns += 1
            cut = len(sample.token_ids) > budget
            if rollout.logprob is not None:
                known = sample.logprob is not None and not cut
                rollout.logprob = rollout.logprob + sample.logprob if known else None
            text = self.tokenizer.decode(sample.token_ids[:budget], skip_special_tokens=True)
            rollout.code = code_blocks(text)
            if not rollout.code:
                rollout.terminate("length" if cut else sample.finish_reason)
            elif len(rollout.response_ids) >= spec.max_new_tokens:
                rollout.terminate("length")  # no room left for the output
            elif rollout.turns == self.config.max_turns:
                rollout.terminate(sample.finish_reason)
            else:
                rollout.state = SampleState.PROCESSING_TOOLS

    def _process_tools(self, waiting: list[ToolRollout], spec: SamplingSpec) -> None:
        """PROCESSING_TOOLS → GENERATING, or TERMINATED when the output fills the budget."""
        outputs = iter(self.run_code([code for r in waiting for code in r.code]))
        for rollout in waiting:
            answers = [next(outputs) for _ in rollout.code]
            rollout.code = []
            rollout.tool_statuses.extend(status for status, _ in answers)
            text = "\n".join(interpreter for _, interpreter in answers)
            tool_ids = self.tokenizer.encode(text, add_special_tokens=False)
            room = spec.max_new_tokens - len(rollout.response_ids)
            rollout.append(tool_ids[:room], written_by_model=False)
            if len(tool_ids) >= room:
                rollout.terminate("length")
            else:
                rollout.state = SampleState.GENERATING

    def run_code(self, code: list[str]) -> list[tuple[str, str]]:
        """Run each piece of code concurrently; (status, `<interpreter>` text) for each, in
        order. A sandbox that fails gives error text, never an exception."""
        code = [print_last_expression(piece) for piece in code]
        results = self.sandbox.execute_all([ExecutionRequest(code=piece) for piece in code])
        answers = []
        for result in results:
            if isinstance(result, ExecutionResult):
                status, body = result.status.value, observation(result)
            else:
                status, body = Status.SANDBOX_ERROR.value, failure_observation(result)
            answers.append((status, interpreter_text(body, self.config.max_tool_response_length)))
        return answers


@dataclass(frozen=True)
class ToolTurn:
    """One model turn of a tool-loop sample: what the model wrote, the code blocks in it, and
    the tool output spliced in after it as the model read it (None: nothing ran after it)."""

    text: str
    code: list[str]
    interpreter: str | None = None


def tool_turns(generation: Generation, decode: Callable[[list[int]], str]) -> list[ToolTurn]:
    """A sample's response cut into turns where tool output (response_mask 0) was spliced in;
    a sample without tool output is one turn. `decode` turns token ids into text (a tokenizer's
    `decode`, special tokens skipped as the loop does)."""
    mask = generation.response_mask or [1] * len(generation.token_ids)
    runs: list[tuple[int, list[int]]] = []  # (written by the model, its token ids)
    for token, written in zip(generation.token_ids, mask, strict=True):
        if runs and runs[-1][0] == written:
            runs[-1][1].append(token)
        else:
            runs.append((written, [token]))
    turns: list[ToolTurn] = []
    for written, token_ids in runs:
        text = decode(token_ids)
        if written or not turns:
            turns.append(ToolTurn(text, code_blocks(text)))
        else:
            turns[-1] = replace(turns[-1], interpreter=text)
    return turns
