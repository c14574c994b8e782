"""The `satseq` entry point, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

import yaml

SATSEQ = [str(Path(sys.executable).parent / "satseq")]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(SATSEQ + list(args), capture_output=True, text=True, timeout=120)


def test_help_lists_commands():
    result = run("--help")
    assert result.returncode == 0
    assert "config" in result.stdout


def test_config_show_prints_resolved_yaml_with_overrides():
    result = run("config", "show", "--set", "trainer.stages=3", "--set", "sat_seq.epsilon=0.1")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["trainer"]["stages"] == 3
    assert resolved["sat_seq"]["epsilon"] == 0.1
    assert len(resolved["team"]["agents"]) == 3


def test_config_show_bad_key_is_a_clear_error_not_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("team:\n  agents: [{name: a, path: p}]\nsat_seq: {epsilon: lots}\n")
    result = run("config", "show", str(bad))
    assert result.returncode == 2
    assert "sat_seq.epsilon" in result.stderr and "bad.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_sandbox_serve_answers_run_code_on_loopback():
    import socket
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [*SATSEQ, "sandbox", "serve", "--port", str(port), "--set", "sandbox.min_isolation=none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/v1/ping", timeout=2).raise_for_status()
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "sandbox server did not come up in 60 s"
                time.sleep(0.5)
        reply = httpx.post(
            f"{url}/run_code", json={"code": "print(6 * 7)", "language": "python"}, timeout=30
        ).json()
        assert reply["status"] == "Success"
        assert reply["run_result"]["stdout"] == "42\n"
        bad = httpx.post(f"{url}/run_code", json={"language": "python"}, timeout=30)
        assert bad.status_code == 422
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_model_build_tiny_writes_a_loadable_hf_directory(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = run("model", "build-tiny", "--out", str(tmp_path / "m"), "--warm-start-steps", "1")
    assert result.returncode == 0, result.stderr
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.model_type == "qwen2"
    assert AutoTokenizer.from_pretrained(tmp_path / "m").chat_template
    bad = run("model", "build-tiny", "--out", str(tmp_path / "x"), "--variant", "nope")
    assert bad.returncode == 2 and "variant" in bad.stderr
