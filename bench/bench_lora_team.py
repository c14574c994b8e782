"""A LoRA team against a full team (design §12; README "LoRA teams"): `satseq train` of each
config as a user runs it, with the peak memory of the run's process tree (the driver, Ray's
processes, every actor: the sum of their proportional set sizes, so shared memory counts once)
sampled every 2 s, each phase's mean seconds per stage (metrics.jsonl), and the held-out team
vote (`satseq eval --dataset synthetic:test`, greedy) before training and after the last stage.
The first config is the baseline every ratio is against, measured in the same run.

    python bench/bench_lora_team.py                                # full smollm2, then LoRA
    python bench/bench_lora_team.py --configs configs/smollm2_lora.yaml --seeds 0 1
    python bench/bench_lora_team.py --configs configs/smollm2_lora.yaml --set trainer.stages=1

"Before" is the base model's vote: a fresh adapter computes the base exactly (B = 0), so every
LoRA agent answers as the base does before its first update.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

SATSEQ = str(Path(sys.executable).parent / "satseq")
GB = 1e9
PHASES = ("rollout", "logprobs", "update", "certificate", "weight_sync")


class MemoryPeak:
    """The largest sum, over a process and its descendants, of their memory (PSS where the
    system reports it, else RSS), sampled every `period_s` while the process runs; and at that
    peak, each kind of process's share and how many there were (`process_kind`)."""

    def __init__(self, pid: int, period_s: float = 2.0):
        self.root = psutil.Process(pid)
        self.period_s = period_s
        self.peak = 0
        self.breakdown: dict[str, float] = {}
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while self.root.is_running() and self.root.status() != psutil.STATUS_ZOMBIE:
            parts: dict[str, float] = {}
            counts: dict[str, int] = {}
            for process in [self.root, *self.root.children(recursive=True)]:
                try:
                    info = process.memory_full_info()
                    kind = process_kind(process.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                parts[kind] = parts.get(kind, 0.0) + getattr(info, "pss", info.rss) / GB
                counts[kind] = counts.get(kind, 0) + 1
            if sum(parts.values()) * GB > self.peak:
                self.peak = int(sum(parts.values()) * GB)
                self.breakdown = {f"{kind} x{counts[kind]}": gb for kind, gb in parts.items()}
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._thread.join(timeout=30)


def process_kind(cmdline: list[str]) -> str:
    """What a process is, for the memory breakdown: a Ray worker's actor class (its title is
    `ray::Class.method` or `ray::IDLE`), a Python script's name, else the program's name."""
    program = cmdline[0] if cmdline else "?"
    if program.startswith("ray::"):
        return "ray::" + re.split(r"[.\s]", program[len("ray::") :], maxsplit=1)[0]
    name = program.rsplit("/", 1)[-1]
    if name.startswith("python") and len(cmdline) > 1 and not cmdline[1].startswith("-"):
        return cmdline[1].rsplit("/", 1)[-1]
    return name


def run(command: list[str], log: Path, watch: Callable[[int], Any] = MemoryPeak):
    """Run `command` (output to `log`) with `watch` started on its pid (by default its memory
    peak) and stopped when it ends; the watcher and the seconds it ran. A failure raises."""
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        watcher = watch(process.pid)
        code = process.wait()
    watcher.stop()
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({code}); see {log}")
    return watcher, time.perf_counter() - started


def eval_summary(
    checkpoint_dir: Path, out: Path, log: Path, *flags: str, dataset: str = "synthetic:test"
) -> dict:
    """`satseq eval`'s summary.json for the team in `checkpoint_dir` on `dataset` (by default
    the held-out problems); `flags` as `satseq eval` takes them (--stage, --against)."""
    command = [SATSEQ, "eval", "--dataset", dataset, "--checkpoint-dir"]
    run([*command, str(checkpoint_dir), "--output-dir", str(out), *flags], log)
    return json.loads((out / "summary.json").read_text())


def team_vote(checkpoint_dir: Path, out: Path, log: Path, stage: int | None = None) -> float:
    """The held-out team vote (maj@1, greedy) of the team in `checkpoint_dir`."""
    flags = ["--stage", str(stage)] if stage is not None else []
    return eval_summary(checkpoint_dir, out, log, *flags)["team_vote_accuracy"]


def base_team(config: Path, overrides: list[str], out_dir: Path) -> Path:
    """A checkpoint dir of the team as it starts: each agent's initial model (a LoRA agent's
    fresh adapter) and the run's config, for `satseq eval`."""
    from satseq.config import TRAIN_CONFIG, dump_config, load_config
    from satseq.launch.agent_models import agent_model_dirs

    resolved = load_config(config, overrides)
    team = out_dir / "base_team"
    shutil.rmtree(team, ignore_errors=True)
    team.mkdir(parents=True)
    for agent, directory in zip(resolved.team.agents, agent_model_dirs(resolved), strict=True):
        (team / agent.name).symlink_to(directory)
    (team / TRAIN_CONFIG).write_text(dump_config(resolved))
    return team


def stage_seconds(stage: dict) -> float:
    """A stage's time as metrics.jsonl gives it: the sum of its phases (`time/*`)."""
    return sum(value for key, value in stage.items() if key.startswith("time/"))


def phase_seconds(metrics: Path) -> dict[str, float]:
    """Each phase's mean seconds per stage."""
    stages = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return {
        phase: statistics.mean(stage.get(f"time/{phase}", 0.0) for stage in stages)
        for phase in PHASES
    }


def measure(config: Path, seed: int, overrides: list[str], root: Path, vote: bool) -> dict:
    name = f"{config.stem}-seed{seed}"
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings = [*overrides, f"trainer.seed={seed}"]
    sets = [part for setting in settings for part in ("--set", setting)]
    memory, seconds = run(
        [SATSEQ, "train", str(config), *sets, "--output-dir", str(out)], out / "train.log"
    )
    result = {"run": name, "peak_gb": memory.peak / GB, "train_s": seconds}
    result["peak_by_process_gb"] = {k: round(v, 2) for k, v in sorted(memory.breakdown.items())}
    result |= phase_seconds(out / "metrics.jsonl")
    if vote:
        before = base_team(config, settings, out)
        eval_summary(before, out / "eval_base", out / "eval_base.log")
        against = ["--against", str(out / "eval_base")]
        paired = eval_summary(out, out / "eval_last", out / "eval_last.log", *against)["against"]
        result["vote_before"] = paired["accuracy_before"]
        result["vote_after"] = paired["accuracy_after"]
        result |= {key: paired[key] for key in ("gained", "lost", "p_value")}
    print(json.dumps(result), flush=True)
    return result


def ratio(value: float, baseline: float) -> str:
    return f" ({value / baseline:.2f}x)" if baseline else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="+", default=["configs/smollm2.yaml", "configs/smollm2_lora.yaml"]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-vote", action="store_true", help="skip the held-out evaluations")
    parser.add_argument("--out", default="/tmp/bench_lora_team")
    args = parser.parse_args()
    root = Path(args.out)
    results = [
        measure(Path(config), seed, args.overrides, root, not args.no_vote)
        for config in args.configs
        for seed in args.seeds
    ]
    baseline = results[0]
    print(f"\nbaseline: {baseline['run']}")
    columns = ["peak_gb", "train_s", *PHASES]
    print("| run | " + " | ".join(columns) + " | vote before → after (gained, lost; McNemar p) |")
    print("|---|" + "---|" * (len(columns) + 1))
    for result in results:
        cells = [f"{result[c]:.2f}" + ratio(result[c], baseline[c]) for c in columns]
        vote = (
            f"{result['vote_before']:.2f} → {result['vote_after']:.2f} "
            f"({result['vote_after'] - result['vote_before']:+.2f}; {result['gained']}, "
            f"{result['lost']}; p {result['p_value']:.2g})"
            if "vote_after" in result
            else "-"
        )
        print(f"| {result['run']} | " + " | ".join(cells) + f" | {vote} |")


if __name__ == "__main__":
    main()
