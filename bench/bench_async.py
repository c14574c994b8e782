"""Overlapped stages (`rollout.max_staleness`) against synchronous ones, on phase durations.

The real scheduler (`satseq.cluster.rollout_queue.RolloutQueue`) runs a few stages whose phases
are sleeps of measured durations, scaled down by --scale: generation on the engines, then the
learners' log-probs and one update per agent, one after another as in SAT-Seq, each followed by
its weight push. At K = 0 every phase waits for the one before; at K = 1 the next stage's
generation runs while this stage's learners update, and the pushes wait for the boundary. The
table gives the stage time (rescaled) at K = 0 and K = 1, their ratio, and the engines' idle time
per stage, for n = 1, 2, 3 agents.

Profiles (seconds):
- `cpu`: this machine's quickstart (configs/quickstart.yaml, 2 cores; median phases of a
  `satseq train` run's metrics.jsonl; --metrics FILE reads another run's);
- `gpu`: a published GPU run, SkyRL's Qwen3.5-9B DAPO table: generation 310 s and training 57 s
  of a 400 s step (the 33 s left are the weight sync and the rest).

Each agent's update costs the profile's per-agent update time. Not a timed test: it prints
numbers. `.venv/bin/python bench/bench_async.py [--profile cpu gpu] [--scale 0.01]`
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from satseq.cluster.rollout_queue import RolloutQueue


@dataclass(frozen=True)
class Profile:
    generate: float  # the engines: one stage's rollouts
    logprobs: float  # the learners: behaviour log-probs of the batch
    update: float  # one agent's update
    sync: float  # one agent's weight push


PROFILES = {
    # the quickstart on this machine (3 agents: time/update 5.05 s over 3 updates)
    "cpu": Profile(generate=2.83, logprobs=0.82, update=5.05 / 3, sync=0.07 / 3),
    "gpu": Profile(generate=310.0, logprobs=0.0, update=57.0, sync=33.0),
}


def cpu_profile(metrics_file: Path, agents: int) -> Profile:
    """Median phases of a training run's metrics.jsonl (its team of `agents`)."""
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]

    def median(key: str) -> float:
        return statistics.median(row[key] for row in rows)

    return Profile(
        median("time/rollout"),
        median("time/logprobs"),
        median("time/update") / agents,
        median("time/weight_sync") / agents,
    )


class SleepingPushes:
    """A weight push that takes `seconds` per agent, deferrable as `WeightSync`'s."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deferred: set[int] | None = None

    def push(self, i: int) -> None:
        if self.deferred is not None:
            self.deferred.add(i)
        else:
            time.sleep(self.seconds)

    def defer(self) -> None:
        self.deferred = set() if self.deferred is None else self.deferred

    def flush(self) -> None:
        agents, self.deferred = self.deferred or set(), None
        time.sleep(self.seconds * len(agents))


def run(profile: Profile, agents: int, max_staleness: int, scale: float, stages: int):
    """(mean stage seconds, mean engine idle seconds per stage), rescaled, over the steady
    stages: the first generates its own rollouts, the last has none to generate ahead."""
    pushes = SleepingPushes(profile.sync * scale)
    queue = RolloutQueue(
        max_staleness,
        plan=lambda stage: stage,
        generate=lambda plan: (time.sleep(profile.generate * scale) or [], {}),
        pushes=pushes,
        agents=[f"a{i}" for i in range(agents)],
    )
    times, idle = [], []
    for stage in range(stages):
        started = time.perf_counter()
        queue.take(stage, stages - 1)
        time.sleep(profile.logprobs * scale)
        for i in range(agents):
            time.sleep(profile.update * scale)
            pushes.push(i)
        queue.boundary()
        seconds = time.perf_counter() - started
        times.append(seconds / scale)
        idle.append(max(seconds - queue.engine_seconds, 0.0) / scale)
    queue.close()
    return statistics.mean(times[1:-1]), statistics.mean(idle[1:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", nargs="+", default=["cpu", "gpu"], choices=PROFILES)
    parser.add_argument("--metrics", type=Path, help="a quickstart run's metrics.jsonl (cpu)")
    parser.add_argument("--scale", type=float, default=None, help="sleep seconds per second")
    parser.add_argument("--stages", type=int, default=6)
    args = parser.parse_args()
    print(f"{'profile':>7} {'n':>2} {'K=0 s':>8} {'K=1 s':>8} {'speed-up':>8} "
          f"{'idle K=0':>9} {'idle K=1':>9} {'idle cut':>8}")  # fmt: skip
    for name in args.profile:
        scale = args.scale or (0.2 if name == "cpu" else 0.002)
        profile = PROFILES[name]
        if name == "cpu" and args.metrics:
            profile = cpu_profile(args.metrics, 3)
        print(
            f"# {name}: generation {profile.generate:.2f} s, log-probs {profile.logprobs:.2f} s, "
            f"update {profile.update:.2f} s an agent, push {profile.sync:.2f} s an agent"
        )
        for agents in (1, 2, 3):
            sync_s, sync_idle = run(profile, agents, 0, scale, args.stages)
            async_s, async_idle = run(profile, agents, 1, scale, args.stages)
            cut = 1 - async_idle / sync_idle if sync_idle else 0.0
            print(
                f"{name:>7} {agents:>2} {sync_s:>8.2f} {async_s:>8.2f} {sync_s / async_s:>7.2f}x "
                f"{sync_idle:>9.2f} {async_idle:>9.2f} {cut:>7.0%}"
            )


if __name__ == "__main__":
    main()
