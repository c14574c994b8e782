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
