"""`satseq report OUTPUT_DIR`: one PNG of a training run, drawn from its metrics.jsonl.

Panels: reward per agent and for the team, KL quantile against the trust-region target, β,
backtracks, the certificate's bandit lower bound (and in how many stages it is positive), and
time per phase.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from satseq.cluster.metric_keys import PHASE_PREFIX, agent_names
from satseq.config import ConfigError, load_config

REPORT_NAME = "report.png"
BANDIT_BOUND = "certificate/bandit_lower_bound"


class ReportError(ValueError):
    """The output directory cannot be reported on; the message names the file (and line)."""


def write_report(output_dir: Path) -> Path:
    """Render `output_dir/report.png` from `output_dir/metrics.jsonl`; returns its path."""
    output_dir = Path(output_dir)
    history = read_metrics(output_dir / "metrics.jsonl")
    target_kl = read_target_kl(output_dir / "train_config.yaml")
    figure = render(history, target_kl, title=f"satseq: {output_dir.name}")
    path = output_dir / REPORT_NAME
    figure.savefig(path, dpi=110)
    return path


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """One record per stage, in file order; a bad line fails with `file:line`."""
    if not path.is_file():
        raise ReportError(f"{path}: not found (is this a `satseq train` output directory?)")
    history = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ReportError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("stage"), int):
            raise ReportError(f"{path}:{number}: expected a JSON object with an integer 'stage'")
        history.append(record)
    if not history:
        raise ReportError(f"{path}: no stages recorded yet")
    return history


def read_target_kl(path: Path) -> float | None:
    """`algorithm.kl_ctrl.target_kl` of the run's resolved config; None when it is absent."""
    if not path.is_file():
        return None
    try:
        return load_config(path).algorithm.kl_ctrl.target_kl
    except ConfigError as err:
        raise ReportError(str(err)) from None


def render(history: list[dict[str, Any]], target_kl: float | None, title: str) -> Figure:
    """A 2×3 grid of panels over the stages in `history`."""
    agents = agent_names(history[-1])
    figure = Figure(figsize=(15, 8.5), layout="constrained")
    figure.suptitle(title)
    reward, kl, beta, backtracks, certificate, phases = figure.subplots(2, 3).flat

    plot_per_agent(reward, history, "reward/mean", agents)
    plot_series(reward, history, "reward/mean", label="team (mean)", color="black", linewidth=2.5)
    plot_series(reward, history, "reward/team_vote", label="team (vote)", color="black", ls="--")
    finish(reward, "reward", "reward (0–1)")

    plot_per_agent(kl, history, "kl_quantile", agents)
    if target_kl is not None:
        kl.axhline(target_kl, color="red", ls="--", label=f"target_kl = {target_kl:g}")
    kl.set_ylim(bottom=0.0)  # the distance to the target reads true
    finish(kl, "KL quantile vs target", "KL(π_θ‖π_cur) quantile")

    plot_per_agent(beta, history, "beta", agents)
    betas = [r[f"beta/{a}"] for r in history for a in agents if is_positive(r.get(f"beta/{a}"))]
    if betas and max(betas) > 10 * min(betas):
        beta.set_yscale("log")  # β grows ×1.5 per violation: runs of violations span decades
    finish(beta, "β (KL penalty)", "β")

    plot_per_agent(backtracks, history, "backtracks", agents, marker="o")
    backtracks.yaxis.set_major_locator(MaxNLocator(integer=True))
    finish(backtracks, "backtracks", "count per stage")

    plot_series(certificate, history, BANDIT_BOUND, label=bandit_bound_label(history))
    certificate.axhline(0.0, color="grey", lw=0.8)
    finish(certificate, "certificate: J(π_new) − J(π_start) ≥", "reward units")

    plot_phase_times(phases, history)
    finish(phases, "time per phase", "seconds")
    return figure


def bandit_bound_label(history: list[dict[str, Any]]) -> str:
    """'bandit bound (> 0 in k of n stages)': how often the stage's bound certified a gain."""
    bounds = [as_float(r.get(BANDIT_BOUND)) for r in history]
    measured = [b for b in bounds if math.isfinite(b)]
    return f"bandit bound (> 0 in {sum(b > 0 for b in measured)} of {len(measured)} stages)"


def plot_series(axes: Axes, history: list[dict[str, Any]], key: str, **style: Any) -> None:
    """Plot `key` over stages; missing or non-finite values are gaps (NaN)."""
    if not any(key in record for record in history):
        return
    stages = [record["stage"] for record in history]
    values = [as_float(record.get(key)) for record in history]
    axes.plot(stages, values, marker=style.pop("marker", "."), **style)


def plot_per_agent(
    axes: Axes, history: list[dict[str, Any]], family: str, agents: list[str], **style: Any
) -> None:
    for agent in agents:
        plot_series(axes, history, f"{family}/{agent}", label=agent, **style)


def plot_phase_times(axes: Axes, history: list[dict[str, Any]]) -> None:
    """Stacked bars: each stage's wall time split into its phases (`time/<phase>`)."""
    phases = list(dict.fromkeys(k for r in history for k in r if k.startswith(PHASE_PREFIX)))
    stages = [record["stage"] for record in history]
    bottom = [0.0] * len(history)
    for phase in phases:
        seconds = [as_float(record.get(phase), missing=0.0) for record in history]
        axes.bar(stages, seconds, bottom=bottom, label=phase.removeprefix(PHASE_PREFIX))
        bottom = [b + s for b, s in zip(bottom, seconds, strict=True)]
    if phases:
        axes.set_ylim(top=1.4 * max(bottom))  # headroom for the legend above the bars


def finish(axes: Axes, title: str, ylabel: str) -> None:
    axes.set_title(title)
    axes.set_xlabel("stage")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def as_float(value: Any, missing: float = math.nan) -> float:
    return float(value) if isinstance(value, int | float) else missing


def is_positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0
