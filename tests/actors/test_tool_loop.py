"""The tool-augmented agent loop with the real pieces: the tiny model warm-started on tool use
(HF engine) and the real local sandbox, in-process and behind the SandboxPool Ray actor.

Greedy answers to warm-start ('train') problems are the model's memorised tool traces:
`<code>print(7+9)</code>`, then (from the loop) `<interpreter>\\n16\\n</interpreter>`, then
`\\boxed{16}`. The model's own continuation after `</code>` is junk, so each of these checks
fails if generation does not stop there.
"""

from __future__ import annotations

import re
from functools import partial

import pytest
import ray

from satseq.actors.engines import make_engine
from satseq.actors.rollout import RolloutActor, RolloutWorker
from satseq.actors.tool_loop import SandboxClient, ToolLoop
from satseq.actors.trajectory import SamplingSpec
from satseq.config.rollout import SandboxConfig, ToolConfig
from satseq.data import TOOL_PROMPT_FORMAT, build_prompt, make_split
from satseq.launch.settings import sandbox_backend
from satseq.models import resolve_model_path
from satseq.sandbox.pool import SandboxPool, SandboxPoolActor
from tests.sandbox.backends import start_backend

TOOLS = ToolConfig(enabled=True)
GREEDY = SamplingSpec(temperature=0.0, max_new_tokens=64)
TOOL_TRACE = re.compile(
    r"<code>print\((?P<expression>[0-9+\-]+)\)</code>"
    r"<interpreter>\n(?P<output>.*?)\n</interpreter>\n\\boxed\{(?P<answer>-?\d+)\}"
)


@pytest.fixture(scope="module")
def tool_model(builtin_models):
    return str(resolve_model_path("builtin:tiny-tool"))


@pytest.fixture(scope="module")
def engine(tool_model):
    engine = make_engine("hf", tool_model, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tokenizer(engine):
    return engine.tokenizer


@pytest.fixture(scope="module")
def sandbox():
    backend = start_backend(workers=2)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    problems = make_split("train", 3, style="symbols")
    return [
        tokenizer.encode(build_prompt(tokenizer, p, TOOL_PROMPT_FORMAT), add_special_tokens=False)
        for p in problems
    ]


def tool_loop(engine, tokenizer, sandbox, **tools) -> ToolLoop:
    return ToolLoop(engine, tokenizer, SandboxClient(sandbox), TOOLS.model_copy(update=tools))


def token_id(tokenizer, token: str) -> int:
    return tokenizer.convert_tokens_to_ids(token)


def test_code_runs_in_the_sandbox_and_its_output_is_spliced_in_untrained(
    engine, tokenizer, sandbox, prompts
):
    results = tool_loop(engine, tokenizer, sandbox).generate(prompts, GREEDY, [1, 1, 1])
    code_end, output_end = token_id(tokenizer, "</code>"), token_id(tokenizer, "</interpreter>")
    for (generation,) in results:
        assert generation.meta == {"tool_calls": 1, "turns": 2, "tool_statuses": ["ok"]}
        assert generation.finish_reason == "stop"
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        trace = TOOL_TRACE.fullmatch(text)
        assert trace, text
        # The sandbox ran the model's code: the output is the expression's value.
        assert trace["output"] == str(eval(trace["expression"]))
        # The model's turn ends at </code>; from the next token to </interpreter> is tool
        # output, masked out; the model writes the rest.
        first_end = generation.token_ids.index(code_end) + 1
        tool_end = generation.token_ids.index(output_end) + 1
        assert generation.token_ids[first_end] == token_id(tokenizer, "<interpreter>")
        mask = generation.response_mask
        assert mask == [1] * first_end + [0] * (tool_end - first_end) + [1] * (len(mask) - tool_end)


def test_the_loop_stops_after_max_turns_and_leaves_the_last_code_unrun(
    engine, tokenizer, sandbox, prompts
):
    (generation,), _, _ = tool_loop(engine, tokenizer, sandbox, max_turns=1).generate(
        prompts, GREEDY, [1, 1, 1]
    )
    assert generation.meta == {"tool_calls": 0, "turns": 1, "tool_statuses": []}
    assert generation.token_ids[-1] == token_id(tokenizer, "</code>")
    assert generation.response_mask == [1] * len(generation.token_ids)


def test_the_length_budget_covers_tool_output_too(engine, tokenizer, sandbox, prompts):
    loop = tool_loop(engine, tokenizer, sandbox)
    ((first_turn,),) = tool_loop(engine, tokenizer, sandbox, max_turns=1).generate(
        prompts[:1], GREEDY, [1]
    )
    code_length = len(first_turn.token_ids)
    # Room for the code and 3 tokens of its output: the output is cut, the response ends.
    ((cut_in_output,),) = loop.generate(
        prompts[:1], SamplingSpec(temperature=0.0, max_new_tokens=code_length + 3), [1]
    )
    assert cut_in_output.finish_reason == "length"
    assert cut_in_output.token_ids[:code_length] == first_turn.token_ids
    assert len(cut_in_output.token_ids) == code_length + 3
    assert cut_in_output.response_mask[code_length:] == [0, 0, 0]
    assert cut_in_output.meta["tool_calls"] == 1
    # No room to close the code block: nothing runs.
    ((cut_in_code,),) = loop.generate(
        prompts[:1], SamplingSpec(temperature=0.0, max_new_tokens=code_length - 2), [1]
    )
    assert cut_in_code.finish_reason == "length"
    assert cut_in_code.token_ids == first_turn.token_ids[:-2]
    assert cut_in_code.meta["tool_calls"] == 0


def test_every_code_block_of_a_turn_runs_and_answers_come_back_in_order(engine, tokenizer, sandbox):
    # The slowest block first: its answer must still come first.
    code = [
        "import time\ntime.sleep(0.6)\nprint('first')",
        "import time\ntime.sleep(0.3)\nprint('second')",
        "x = 3\nx * 7",  # a last expression is shown, as in a REPL
    ]
    answers = tool_loop(engine, tokenizer, sandbox).run_code(code)
    assert answers == [
        ("ok", "<interpreter>\nfirst\n</interpreter>"),
        ("ok", "<interpreter>\nsecond\n</interpreter>"),
        ("ok", "<interpreter>\n21\n</interpreter>"),
    ]


def test_sandbox_timeouts_and_errors_become_text_for_the_model(engine, tokenizer):
    quick = start_backend(workers=2, timeout_s=1.0)
    # An in-process SandboxPool: its workers live on the client's event loop across calls.
    client = SandboxClient(SandboxPool(lambda: quick, workers=2))
    loop = ToolLoop(
        engine, tokenizer, client, TOOLS.model_copy(update={"max_tool_response_length": 64})
    )
    try:
        answers = loop.run_code(["while True:\n    pass", "print('x' * 1000)", "1 / 0"])
        assert loop.run_code(["print(2)"]) == [("ok", "<interpreter>\n2\n</interpreter>")]
    finally:
        client.close()
        quick.close()
    (timeout, timeout_text), (ok, long_text), (error, error_text) = answers
    assert (timeout, ok, error) == ("timeout", "ok", "error")
    assert "TimeoutError" in timeout_text
    assert len(long_text) <= 64 + len("<interpreter>\n\n</interpreter>")
    assert "characters cut" in long_text
    # A long traceback keeps its head and its tail, where the error is.
    assert error_text.startswith("<interpreter>\nTraceback")
    assert error_text.endswith("division by zero\n</interpreter>")


@pytest.mark.slow
def test_rollout_actor_calls_the_sandbox_pool_actor_and_survives_its_death(
    ray_cluster, tool_model, tokenizer, prompts
):
    pool = SandboxPoolActor.remote(partial(sandbox_backend, SandboxConfig(workers=2)), workers=2)
    ray.get(pool.start.remote())
    rollout = RolloutActor.remote({"a": tool_model}, tools=TOOLS, sandbox=pool)
    requests = [("a", prompts[0], 2)]
    (samples,) = ray.get(rollout.generate.remote(requests, GREEDY))
    assert [s.meta["tool_statuses"] for s in samples] == [["ok"], ["ok"]]
    assert ray.get(pool.metrics.remote())["executions"] == 2

    ray.kill(pool)
    (samples,) = ray.get(rollout.generate.remote(requests, GREEDY))
    for sample in samples:
        assert sample.meta["tool_statuses"] == ["sandbox_error"]
        text = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        assert "<interpreter>\nSandboxError: the code could not be run:" in text
    ray.get(rollout.close.remote())


def test_the_worker_without_tools_is_unchanged_and_tools_need_a_sandbox(tool_model):
    with pytest.raises(ValueError, match="need a sandbox"):
        RolloutWorker({"a": tool_model}, tools=TOOLS)
    worker = RolloutWorker({"a": tool_model}, tools=ToolConfig(enabled=False))
    assert worker.tool_loops == {}
    worker.close()
