"""Overlapped stages in real runs: `satseq train` of a config at K = 0 and K = 1
(`rollout.max_staleness`), each as a user runs it, with the rollout actors and the learners
pinned to separate cores (--pin), and the held-out team vote before training and after the
last stage (`satseq eval --dataset synthetic:test`).

Per run, the mean over the steady stages (all but the first and the last: the first generates
its own rollouts, the last has none to generate ahead) of the stage time (the sum of its
phases), `util/engine_busy`, `util/learner_busy`, the engines' idle seconds a stage (stage time
× (1 − engine busy)), `async/staleness_mean` and the off-policy weight's mean and minimum. The
K = 0 run of each seed is the baseline of its K = 1 run, measured in the same invocation
(`--staleness` sets which K run, in order).

    python bench/bench_async_runs.py --config configs/smollm2.yaml --seeds 0 --pin
    python bench/bench_async_runs.py --config configs/quickstart.yaml --seeds 0 1 2

--pin: the processes of the rollout actors (Ray titles them `satseq-rollout-*` while they start,
`RolloutWorker` after) and their children (an engine's own processes) run on the first half of
the machine's cores, the learners' (`satseq-learner-*`, `Learner`, `LearnerRank`) on the rest;
every thread of each, re-applied as threads start. Ray's own processes, the driver and
the coordinator are left where the OS puts them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
from pathlib import Path

import psutil
from bench_lora_team import SATSEQ, MemoryPeak, base_team, run, stage_seconds, team_vote

from satseq.report import read_metrics

ROLES = {
    "ray::satseq-rollout": "rollout",  # an actor's process while its __init__ runs
    "ray::RolloutWorker": "rollout",  # and after it (Ray titles it by class then)
    "ray::satseq-learner": "learner",
    "ray::Learner": "learner",  # Learner and LearnerRank
}


class CorePinning:
    """Pins the rollout actors of the process tree under `pid` to `rollout_cores` and the
    learners to `learner_cores`, scanning every `period_s` until the root process ends."""

    def __init__(self, pid: int, rollout_cores: set[int], learner_cores: set[int], period_s=0.5):
        self.root = psutil.Process(pid)
        self.cores = {"rollout": rollout_cores, "learner": learner_cores}
        self.period_s = period_s
        self.pinned: dict[str, set[int]] = {"rollout": set(), "learner": set()}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def role(self, process: psutil.Process) -> str | None:
        title = " ".join(process.cmdline()[:1])
        return next((r for prefix, r in ROLES.items() if title.startswith(prefix)), None)

    def _watch(self) -> None:
        while not self._done.wait(self.period_s):
            try:
                children = self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            for process in children:
                try:
                    role = self.role(process)
                    if role is None:
                        continue
                    for member in [process, *process.children(recursive=True)]:
                        self._pin(member.pid, role)
                except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
                    continue

    def _pin(self, pid: int, role: str) -> None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                if os.sched_getaffinity(int(task.name)) != self.cores[role]:
                    os.sched_setaffinity(int(task.name), self.cores[role])
            except (ProcessLookupError, FileNotFoundError):
                continue
        self.pinned[role].add(pid)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)


def split_cores() -> tuple[set[int], set[int]]:
    """The machine's cores: the first half for the rollout actors, the rest for the learners."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    return set(cores[:half]), set(cores[half:]) or set(cores)


def steady_means(stages: list[dict]) -> dict[str, float]:
    """Means over the steady stages (all but the first and the last, where there are three or
    more) of the stage time, the busy fractions, the engines' idle seconds, the staleness and the
    rollout correction (its mean weight and the engine–learner log-prob mismatch; the smallest
    weight over them)."""
    steady = stages[1:-1] if len(stages) >= 3 else stages
    stage_s = [stage_seconds(stage) for stage in steady]
    engine = [s.get("util/engine_busy", 0.0) for s in steady]
    return {
        "stage_s": statistics.mean(stage_s),
        "engine_busy": statistics.mean(engine),
        "learner_busy": statistics.mean(s.get("util/learner_busy", 0.0) for s in steady),
        "engine_idle_s": statistics.mean(t * (1 - b) for t, b in zip(stage_s, engine, strict=True)),
        "staleness": statistics.mean(s.get("async/staleness_mean", 0.0) for s in steady),
        "dropped": sum(s.get("async/dropped", 0) for s in stages),
        "weight_mean": statistics.mean(
            s.get("rollout/correction_weight_mean", 1.0) for s in steady
        ),
        "weight_min": min(s.get("rollout/correction_weight_min", 1.0) for s in steady),
        "mismatch": statistics.mean(s.get("rollout/logprob_mismatch", 0.0) for s in steady),
    }


def measure(config: Path, seed: int, K: int, pin: bool, overrides: list[str], root: Path) -> dict:
    name = f"{config.stem}-seed{seed}-K{K}"
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings = [*overrides, f"trainer.seed={seed}", f"rollout.max_staleness={K}"]
    sets = [part for setting in settings for part in ("--set", setting)]
    command = [SATSEQ, "train", str(config), *sets, "--output-dir", str(out)]
    result: dict = {"run": name, "seed": seed, "K": K}
    if pin:
        cores = split_cores()
        pinning, result["train_s"] = run(
            command, out / "train.log", lambda pid: CorePinning(pid, *cores)
        )
        result["pinned"] = {role: len(pids) for role, pids in pinning.pinned.items()}
    else:
        memory, result["train_s"] = run(command, out / "train.log", MemoryPeak)
        result["peak_gb"] = memory.peak / 1e9
    result |= steady_means(read_metrics(out / "metrics.jsonl"))
    before = base_team(config, settings, out)
    result["vote_before"] = team_vote(before, out / "eval_base", out / "eval_base.log")
    result["vote_after"] = team_vote(out, out / "eval_last", out / "eval_last.log")
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/smollm2.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1], help="K, in order")
    parser.add_argument("--pin", action="store_true", help="rollout actors and learners apart")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="/tmp/bench_async_runs")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        for K in args.staleness:
            rows.append(measure(args.config, seed, K, args.pin, args.overrides, Path(args.out)))
    print(f"\n{args.config}, pinned: {args.pin}")
    print("| seed | K | held-out vote, before → after | stage s | engine busy | learner busy "
          "| engine idle s (cut) | staleness | dropped | correction mean / min (mismatch) "
          "| train s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        baseline = next((r for r in rows if r["seed"] == row["seed"] and r["K"] == 0), None)
        cut = "-"
        if baseline and row["K"]:
            cut = f"{1 - row['engine_idle_s'] / baseline['engine_idle_s']:.0%}"
        gain = row["vote_after"] - row["vote_before"]
        print(
            f"| {row['seed']} | {row['K']} | {row['vote_before']:.2f} → {row['vote_after']:.2f} "
            f"({gain:+.2f}) | {row['stage_s']:.1f} | {row['engine_busy']:.2f} "
            f"| {row['learner_busy']:.2f} | {row['engine_idle_s']:.1f} ({cut}) "
            f"| {row['staleness']:.2f} | {row['dropped']} "
            f"| {row['weight_mean']:.3f} / {row['weight_min']:.3f} ({row['mismatch']:.1e}) "
            f"| {row['train_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
