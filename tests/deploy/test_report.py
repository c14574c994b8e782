"""`satseq report OUTPUT_DIR` draws OUTPUT_DIR/report.png from metrics.jsonl."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from satseq.config import dump_config, load_config
from satseq.report import read_metrics, render, write_report

SATSEQ = str(Path(sys.executable).parent / "satseq")


def stage(k: int, reward: float) -> dict:
    return {
        "stage": k,
        "reward/mean": reward,
        "reward/team_vote": reward,
        "certificate/bandit_lower_bound": float("nan") if k == 0 else -0.1,
        "time/rollout": 2.0,
        "time/update": 3.0,
        **{f"reward/mean/{a}": reward for a in ("a0", "a1")},
        **{f"kl_quantile/{a}": 0.01 * (k + 1) for a in ("a0", "a1")},
        **{f"beta/{a}": 0.01 * 20**k for a in ("a0", "a1")},  # over a decade: log scale
        **{f"backtracks/{a}": k for a in ("a0", "a1")},
    }


def write_run(output_dir: Path, records: list[dict], target_kl: float) -> None:
    output_dir.mkdir(exist_ok=True)
    (output_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = load_config(None, [f"algorithm.kl_ctrl.target_kl={target_kl}"])
    (output_dir / "train_config.yaml").write_text(dump_config(config))


def report(output_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SATSEQ, "report", str(output_dir)], capture_output=True, text=True, timeout=120
    )


def test_panels_plot_each_agent_the_team_and_the_configured_kl_target(tmp_path):
    write_run(tmp_path, [stage(0, 0.4), stage(1, 0.6)], target_kl=0.07)
    path = write_report(tmp_path)
    assert path == tmp_path / "report.png"
    assert imread(path).shape[:2] == (935, 1650)  # figsize (15, 8.5) at 110 dpi

    figure = render(read_metrics(tmp_path / "metrics.jsonl"), 0.07, "t")
    reward, kl, beta, backtracks, certificate, phases = figure.axes
    assert [line.get_label() for line in reward.get_lines()] == [
        "a0",
        "a1",
        "team (mean)",
        "team (vote)",
    ]
    target = next(line for line in kl.get_lines() if line.get_label() == "target_kl = 0.07")
    assert list(target.get_ydata()) == [0.07, 0.07]
    assert beta.get_yscale() == "log"
    assert list(backtracks.get_lines()[1].get_ydata()) == [0, 1]
    bound = certificate.get_lines()[0].get_ydata()
    assert math.isnan(bound[0]) and bound[1] == -0.1  # no held-out prompts: a gap
    assert [p.get_height() for p in phases.patches] == [2.0, 2.0, 3.0, 3.0]  # stacked by phase


def test_report_command_writes_the_png_and_prints_its_path(tmp_path):
    write_run(tmp_path, [stage(0, 0.5)], target_kl=0.05)
    result = report(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"report: {tmp_path / 'report.png'}"
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "metrics.jsonl: not found"),
        ("", "no stages recorded yet"),
        ('{"stage": 0}\n{"stage": 1, "reward', "metrics.jsonl:2: not valid JSON"),
        ('{"stage": 0}\n\n[1, 2]\n', "metrics.jsonl:3: expected a JSON object"),
    ],
)
def test_report_names_the_file_and_line_of_bad_metrics(tmp_path, content, message):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    result = report(tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "report.png").exists()


@pytest.mark.slow
def test_report_of_a_real_run(observed_run):
    result = report(observed_run.output_dir)
    assert result.returncode == 0, result.stderr
    image = imread(observed_run.output_dir / "report.png")
    assert image.shape[:2] == (935, 1650)
    assert image[..., :3].std() > 0.05  # panels were drawn, not a blank canvas
