"""The `satseq` entry point, run as a user runs it."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from satseq.cli.common import config_and_overrides
from satseq.config import CONFIG_DIR
from tests.deploy.satseq_cli import parse_satseq_command

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


def test_python_dash_m_satseq_is_the_satseq_command():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "satseq",
            "config",
            "show",
            "trainer.stages=5",
            "--key",
            "trainer.stages",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "5\n"


def test_key_value_overrides_follow_config_and_come_before_set():
    """Hydra's spelling beside --set: verl's data.train_files replaces the file's data.train."""
    result = run(
        "config",
        "show",
        str(CONFIG_DIR / "sat_seq.yaml"),
        "trainer.stages=3",
        "data.train_files=[a.parquet, b.parquet]",
        "--set",
        "trainer.stages=4",
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["trainer"]["stages"] == 4
    assert resolved["data"]["train"] == ["a.parquet", "b.parquet"]
    assert resolved["team"]["agents"][0]["name"] == "solver_a"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.stages=abc", "trainer.stages: Input should be a valid integer"),
        ("sat_seq.epsilonn=0.1", "sat_seq.epsilonn: unknown key"),
        ("team.agents.5.path=/m", "team.agents.5: index must be 0..2"),
        ("data.train=[a.parquet", "the value of data.train is not valid YAML"),
    ],
)
def test_a_bad_key_value_override_fails_as_the_same_set_does(override, named):
    positional = run("config", "show", override)
    with_set = run("config", "show", "--set", override)
    assert positional.returncode == with_set.returncode == 2
    assert named in positional.stderr
    assert positional.stderr == with_set.stderr
    assert "Traceback" not in positional.stderr


def test_train_refuses_a_bad_override_before_it_starts_anything():
    result = run("train", "trainer.batch_size=0")
    assert result.returncode == 2
    assert "trainer.batch_size" in result.stderr and "Traceback" not in result.stderr


def test_train_takes_key_value_overrides_as_typed_in_order():
    """Without a CONFIG the first KEY=VALUE is an override; a URI keeps its `//`."""
    command = [
        "satseq", "train", "output.dir=s3://bucket/runs", "trainer.stages=3", "--resume",
        "--set", "trainer.stages=4",
    ]  # fmt: skip
    name, params = parse_satseq_command(command)
    assert name == "satseq train" and params["resume"] is True
    config, overrides = config_and_overrides(params["config"], params["overrides"], params["set_"])
    assert config is None
    assert overrides == ["output.dir=s3://bucket/runs", "trainer.stages=3", "trainer.stages=4"]
    config_file = CONFIG_DIR / "sat_seq.yaml"
    _, params = parse_satseq_command(["satseq", "train", str(config_file), "trainer.stages=3"])
    assert config_and_overrides(params["config"], params["overrides"], None) == (
        config_file,
        ["trainer.stages=3"],
    )


def test_serve_takes_a_host():
    command = ["satseq", "serve", "--checkpoint-dir", "out", "--host", "0.0.0.0", "--port", "80"]
    _, params = parse_satseq_command(command)
    assert (params["host"], params["port"]) == ("0.0.0.0", 80)


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
