"""The SandboxFusion client on its own: the status mapping for SandboxFusion's answers, and
retries, with a scripted transport instead of a server (test_server.py uses a real one)."""

import asyncio
import base64
import json

import httpx
import pytest

from satseq.sandbox.fusion_api import RunCodeResponse, from_fusion_response
from satseq.sandbox.fusion_client import FusionBackend
from satseq.sandbox.types import ExecutionRequest, Status


def answer(status="Success", run_status="Finished", return_code=0, stdout="", stderr="", **rest):
    """A SandboxFusion /run_code answer (no satseq extension)."""
    run_result = {
        "status": run_status,
        "return_code": return_code,
        "execution_time": 0.1,
        "stdout": stdout,
        "stderr": stderr,
    }
    return {"status": status, "message": "", "run_result": run_result, **rest}


@pytest.mark.parametrize(
    ("response", "status"),
    [
        (answer(), Status.OK),
        (answer("Failed", return_code=1), Status.ERROR),
        (answer("Failed", "TimeLimitExceeded", return_code=None), Status.TIMEOUT),
        (answer("Failed", return_code=1, stderr="Traceback ...\nMemoryError\n"), Status.MEMORY),
        (answer("SandboxError", "Error", return_code=None), Status.SANDBOX_ERROR),
        (
            {
                "status": "Failed",
                "message": "",
                "compile_result": {"status": "Finished", "return_code": 1, "stderr": "syntax"},
            },
            Status.ERROR,
        ),
        (
            {"status": "Failed", "message": "", "compile_result": {"status": "TimeLimitExceeded"}},
            Status.TIMEOUT,
        ),
    ],
    ids=["ok", "error", "timeout", "memory", "sandbox-error", "compile-error", "compile-timeout"],
)
def test_sandbox_fusion_statuses_map_to_ours(response, status):
    result = from_fusion_response(RunCodeResponse.model_validate(response), 1000)
    assert result.status == status
    assert result.backend == "sandbox_fusion" and result.isolation is None


def test_output_over_the_limit_is_cut_and_reported():
    response = RunCodeResponse.model_validate(answer(stdout="é" * 600))
    result = from_fusion_response(response, max_output_bytes=1001)
    assert result.status == Status.OUTPUT_LIMIT and result.truncated
    assert result.stdout == "é" * 500  # cut at a character boundary


def test_fetched_files_are_decoded():
    files = {"out.bin": base64.b64encode(b"\x00\xff").decode()}
    result = from_fusion_response(RunCodeResponse.model_validate(answer(files=files)), 10)
    assert result.fetched_files == {"out.bin": b"\x00\xff"}


def scripted(*steps):
    """A transport that plays `steps` in order: an exception to raise, or (status, json)."""
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        step = steps[min(len(calls), len(steps)) - 1]
        if isinstance(step, Exception):
            raise step
        return httpx.Response(step[0], json=step[1])

    return httpx.MockTransport(handle), calls


def execute(transport, request=None, **options):
    async def go():
        backend = FusionBackend(
            "http://sandbox.test", transport=transport, backoff_s=0.01, **options
        )
        try:
            return await backend.execute(request or ExecutionRequest(code="print(1)"))
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_connection_errors_5xx_and_sandbox_errors_are_retried():
    transport, calls = scripted(
        httpx.ConnectError("refused"),
        (503, {"detail": "busy"}),
        (200, answer("SandboxError", "Error", return_code=None)),
        (200, answer(stdout="1\n")),
    )
    result = execute(transport)
    assert (result.status, result.stdout, len(calls)) == (Status.OK, "1\n", 4)


def test_retries_give_up_with_a_sandbox_error_naming_the_last_failure():
    transport, calls = scripted((502, {"detail": "bad gateway"}))
    result = execute(transport, max_retries=2)
    assert result.status == Status.SANDBOX_ERROR and len(calls) == 3
    assert "gave up after 3 attempts" in result.stderr and "HTTP 502" in result.stderr


def test_a_4xx_answer_is_not_retried():
    transport, calls = scripted((422, {"detail": "unsupported language"}))
    result = execute(transport)
    assert result.status == Status.SANDBOX_ERROR and len(calls) == 1
    assert "unsupported language" in result.stderr


def test_a_read_timeout_is_not_retried():
    transport, calls = scripted(httpx.ReadTimeout("slow"))
    result = execute(transport)
    assert result.status == Status.SANDBOX_ERROR and len(calls) == 1
    assert "no answer within" in result.stderr


def test_the_request_carries_the_memory_limit_and_the_time_budget():
    transport, calls = scripted((200, answer()))
    request = ExecutionRequest(code="x", files={"a.bin": b"\x01"}, memory_mb=300, timeout_s=2)
    execute(transport, request, compile_timeout_s=3)
    sent = calls[0]
    body = json.loads(sent.content)
    assert body["memory_limit_MB"] == 300 and body["run_timeout"] == 2
    assert body["files"] == {"a.bin": base64.b64encode(b"\x01").decode()}
    assert sent.extensions["timeout"]["read"] == 2 + 3 + 10  # run + compile + 10 s


def test_concurrency_is_bounded():
    in_flight, peak = 0, 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return httpx.Response(200, json=answer())

    async def go():
        backend = FusionBackend(
            "http://sandbox.test", transport=httpx.MockTransport(handle), max_concurrency=3
        )
        request = ExecutionRequest(code="print(1)")
        results = await asyncio.gather(*(backend.execute(request) for _ in range(12)))
        await backend.aclose()
        return results

    assert all(r.status == Status.OK for r in asyncio.run(go()))
    assert peak == 3
