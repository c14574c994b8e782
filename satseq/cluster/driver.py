"""The training driver behind `satseq train`: connect to Ray, start the coordinator, run the
stages with a progress display, and end with a summary table."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from satseq.cluster.coordinator_actor import CoordinatorActor
from satseq.cluster.metric_keys import PEAK_MEMORY
from satseq.config import TRAIN_CONFIG, RunConfig, dump_config
from satseq.launch.connection import connect

console = Console()


def output_dir_for(config: RunConfig, output_dir: str | None) -> Path:
    return Path(output_dir) if output_dir else Path(config.output.dir) / config.output.exp_name


class StopAfterStage:
    """First Ctrl-C: finish the running stage, checkpoint it, stop. Second: stop at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, self._previous)
            raise KeyboardInterrupt
        self.requested = True
        console.print(
            "[yellow]Ctrl-C: finishing this stage and checkpointing (Ctrl-C again to abort)"
        )

    def restore(self) -> None:
        signal.signal(signal.SIGINT, self._previous)


def save_config(config: RunConfig, out: Path) -> None:
    """The run's config as `--resume` reads it: out/train_config.yaml, and a copy at
    `output.storage` (a resume on a node that never held the run reads it there)."""
    (out / TRAIN_CONFIG).write_text(dump_config(config))
    if config.output.storage is not None:
        from satseq.storage import StorageMirror  # pyarrow, only when a URI is given

        StorageMirror(out, config.output.storage).upload(out / TRAIN_CONFIG)


def train(
    config: RunConfig,
    output_dir: str | None = None,
    resume: bool = False,
    address: str | None = None,
) -> list[dict[str, Any]]:
    """Run the configured stages; returns the metrics of the stages run by this call."""
    started = time.perf_counter()
    out = output_dir_for(config, output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(config, out)
    if any(agent.trust_remote_code for agent in config.team.agents):
        from satseq.launch.agent_models import trust_team  # torch: only where it is needed

        trust_team(config, out)  # before Ray starts: its workers read the list
    connect(address)
    coordinator = CoordinatorActor.options(
        name="satseq-coordinator",
        # beside the driver: the loss of a worker node must not take the stage loop with it
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        ),
    ).remote(config, str(out), resume)
    first_stage = ray.get(coordinator.next_stage.remote())
    for warning in ray.get(coordinator.start_warnings.remote()):
        console.print(f"[yellow]warning: {warning}")
    if resume:
        console.print(
            f"resuming at stage {first_stage}"
            if first_stage
            else "no checkpoint found: starting at stage 0"
        )
    history: list[dict[str, Any]] = []
    stop = StopAfterStage()
    try:
        with Progress(
            TextColumn("[bold]stage {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("starting", total=config.trainer.stages, completed=first_stage)
            while not ray.get(coordinator.finished.remote()):
                pending = coordinator.run_stage.remote()
                while not ray.wait([pending], timeout=0.5)[0]:
                    progress.update(
                        task,
                        description=_describe(ray.get(coordinator.get_progress.remote()), history),
                    )
                history.append(ray.get(pending))
                progress.update(task, advance=1, description=_describe({"phase": "done"}, history))
                if stop.requested:
                    console.print(
                        f"stopped after stage {history[-1]['stage']}; continue with --resume"
                    )
                    break
    finally:
        stop.restore()
        for warning in ray.get(coordinator.close.remote()):
            console.print(f"[yellow]warning: {warning}")
        ray.kill(coordinator)
    if history:
        console.print(summary_table(config, history, time.perf_counter() - started))
        console.print(f"outputs: {out}")
    return history


def _describe(progress: dict[str, Any], history: list[dict[str, Any]]) -> str:
    parts = [progress.get("phase", "")]
    if progress.get("agent"):
        parts.append(f"agent {progress['agent']}")
    if history:
        last = history[-1]
        backtracks = sum(v for k, v in last.items() if k.startswith("backtracks/"))
        parts.append(f"reward {last['reward/mean']:.3f}  backtracks {backtracks}")
        if "async/staleness_mean" in last:  # overlapped stages: the rollouts' versions old
            parts.append(f"staleness {last['async/staleness_mean']:.0f}")
        peaks = [
            f"{key.rpartition('/')[2]} {value:.1f}"
            for key, value in last.items()
            if key.startswith(PEAK_MEMORY + "/")
        ]
        if peaks:  # where the device reports it (CUDA)
            parts.append(f"update peak GiB {' '.join(peaks)}")
    if progress.get("faults"):
        parts.append(f"[yellow]recovered from {progress['faults']} actor/node losses")
    if progress.get("trackers_failed"):  # the warning itself is printed at the end
        parts.append(f"[yellow]not logging to {', '.join(progress['trackers_failed'])}")
    return "  ".join(parts)


def summary_table(config: RunConfig, history: list[dict[str, Any]], wall_s: float) -> Table:
    first, last = history[0], history[-1]
    table = Table(title=f"satseq: stages {first['stage']}–{last['stage']} in {wall_s:.0f} s")
    table.add_column("")
    table.add_column(f"stage {first['stage']}", justify="right")
    table.add_column(f"stage {last['stage']}", justify="right")
    for agent in config.team.agents:
        key = f"reward/mean/{agent.name}"
        table.add_row(f"reward {agent.name}", f"{first[key]:.3f}", f"{last[key]:.3f}")
    rows = [("reward team (mean)", "reward/mean"), ("reward team (vote)", "reward/team_vote")]
    rows += [("certificate (bandit bound)", "certificate/bandit_lower_bound")]
    rows += [
        ("p_hat mean (SPO)", "spo/p_hat_mean"),
        ("degenerate groups", "groups/degenerate_fraction"),
    ]
    for label, key in rows:  # each algorithm logs its own subset of these
        if key in first and key in last:
            table.add_row(label, f"{first[key]:.3f}", f"{last[key]:.3f}")
    if config.algorithm.name == "sat_seq":
        backtracks = sum(v for m in history for k, v in m.items() if k.startswith("backtracks/"))
        table.add_row("backtracks (all stages)", "", str(backtracks))
    return table
