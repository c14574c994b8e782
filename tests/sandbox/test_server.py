"""`satseq sandbox serve` as a real HTTP server on loopback, driven by our SandboxFusion
client and by raw requests: statuses and files survive the trip, bad requests get 4xx."""

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from satseq.sandbox.fusion_client import FusionBackend
from satseq.sandbox.server import create_app
from satseq.sandbox.types import ExecutionRequest, IsolationLevel, Status


@pytest.fixture(scope="module")
def server_url(sandbox):
    """The app on 127.0.0.1 at a free port, served from a thread for this module."""
    server = uvicorn.Server(
        uvicorn.Config(create_app(sandbox), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


def execute(url, request, **options):
    async def go():
        backend = FusionBackend(url, **options)
        try:
            return await backend.execute(request)
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_ping(server_url):
    response = httpx.get(f"{server_url}/v1/ping", timeout=10)
    assert (response.status_code, response.json()) == (200, "pong")


@pytest.mark.parametrize(
    ("code", "limits", "status"),
    [
        ("print('hi')", {}, Status.OK),
        ("raise SystemExit(2)", {}, Status.ERROR),
        ("import time\ntime.sleep(30)", {"timeout_s": 1.0}, Status.TIMEOUT),
        ("data = 'x' * (2 * 1024**3)", {"memory_mb": 128}, Status.MEMORY),
        ("print('x' * 10_000)", {"max_output_bytes": 100}, Status.OUTPUT_LIMIT),
    ],
    ids=["ok", "error", "timeout", "memory", "output_limit"],
)
def test_every_status_survives_the_http_round_trip(server_url, code, limits, status):
    result = execute(server_url, ExecutionRequest(code=code, **limits))
    assert result.status == status, result
    assert result.backend == "sandbox_fusion" and result.isolation == IsolationLevel.FULL


def test_stdin_files_and_exit_code_survive_the_round_trip(server_url):
    blob = bytes(range(256)) * 10
    request = ExecutionRequest(
        code="import sys; open('out.bin', 'wb').write(open('in.bin', 'rb').read()[::-1]);"
        "print(sys.stdin.read().upper()); sys.exit(5)",
        stdin="ünïcode\n",
        files={"in.bin": blob},
        fetch_files=["out.bin"],
    )
    result = execute(server_url, request)
    assert (result.status, result.return_code) == (Status.ERROR, 5)
    assert result.stdout == "ÜNÏCODE\n\n"
    assert result.fetched_files == {"out.bin": blob[::-1]}


def test_a_sandboxfusion_style_request_gets_a_sandboxfusion_style_answer(server_url):
    payload = {"code": "print(6 * 7)", "language": "python", "run_timeout": 5}
    response = httpx.post(f"{server_url}/run_code", json=payload, timeout=30)
    body = response.json()
    assert response.status_code == 200
    assert body["status"] == "Success"
    assert body["run_result"]["status"] == "Finished"
    assert (body["run_result"]["return_code"], body["run_result"]["stdout"]) == (0, "42\n")


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"code": "x", "language": "cpp"}, "unsupported language"),
        ({"code": "x", "language": "python", "files": {"a": "not base64!"}}, "base64"),
        ({"code": "x", "language": "python", "files": {"../a": "eA=="}}, "working dir"),
        ({"code": "x", "language": "python", "fetch_files": ["/etc/passwd"]}, "relative"),
        ({"code": "x", "language": "python", "run_timeout": -1}, "timeout_s"),
        ({"code": "x", "language": "python", "memory_limit_MB": 1}, "memory_mb"),
        ({"language": "python"}, "code"),
        ("not json at all", ""),
    ],
    ids=["language", "base64", "path", "fetch-path", "timeout", "memory", "no-code", "not-json"],
)
def test_bad_requests_get_a_4xx_with_a_message(server_url, payload, message):
    if isinstance(payload, str):
        response = httpx.post(f"{server_url}/run_code", content=payload, timeout=10)
    else:
        response = httpx.post(f"{server_url}/run_code", json=payload, timeout=10)
    assert 400 <= response.status_code < 500
    assert message in response.text


def test_the_client_gives_up_on_a_port_with_no_server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        result = execute(f"http://127.0.0.1:{port}", ExecutionRequest(code="1"), backoff_s=0.01)
    assert result.status == Status.SANDBOX_ERROR
    assert "gave up after 4 attempts" in result.stderr and "ConnectError" in result.stderr
