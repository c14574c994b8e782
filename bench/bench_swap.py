"""Plug-and-play on the quickstart: one agent swapped mid-training for a stronger model.

The stronger model is a tiny `carry` model warm-started on a perfect teacher's solutions (it
carries every time and knows every addition fact; `satseq model build-tiny --variant carry`),
with its own seed. Three runs of the real `satseq train` on configs/quickstart.yaml, same seed:

- `no swap`: the quickstart as it is;
- `projected`: agent a2 swapped for the stronger model before stage `--at`, first projected
  towards the outgoing a2 (mean per-state KL ≤ δ0, design §4), then trained on;
- `λ = 0`: the same swap with no projection (δ0 so large that λ = 0: the incoming model as is).

Each run's team is scored with `satseq eval` on 200 held-out `synthetic:test` problems (K = 4
samples per agent, T 0.6) at the stage before the swap, the swap stage (right after it, the stage
having trained once on the projected model), and the last stage: team vote, best agent, and a2
alone. The swap's own metrics (λ, KL after distillation, distillation steps) come from
metrics.jsonl. Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_swap.py [--at 7] [--seed 0] [--out outputs/bench_swap]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from satseq.config import load_config
from satseq.models import build_tiny_model
from satseq.report import read_metrics

SATSEQ = str(Path(sys.executable).parent / "satseq")
SWAPPED = "a2"
STRONGER_SEED = 3  # the quickstart team's models use seeds 0-2
RUN_DIRS = {"no swap": "no_swap", "projected": "projected", "λ = 0": "lambda_0"}
NO_PROJECTION_DELTA0 = 1e9  # λ = 0 already meets it: the target is the incoming model itself


def satseq(*args: str) -> None:
    subprocess.run([SATSEQ, *args], check=True, stdout=subprocess.DEVNULL)


def runs(stronger: Path, at: int) -> dict[str, list[str]]:
    """Each run's `--set` overrides of the quickstart."""

    def swap(delta0: float) -> str:
        entry = f"agent: {SWAPPED}, path: '{stronger}', at_stage: {at}, delta0: {delta0}"
        return f"team.swaps=[{{{entry}}}]"

    return {"no swap": [], "projected": [swap(0.05)], "λ = 0": [swap(NO_PROJECTION_DELTA0)]}


def held_out(run_dir: Path, stage: int) -> dict[str, float]:
    """Team vote, best agent and the swapped slot's accuracy at `stage` on synthetic:test."""
    out = run_dir / "eval" / f"stage_{stage}"
    if not (out / "summary.json").is_file():
        satseq(
            "eval", "--dataset", "synthetic:test", "--checkpoint-dir", str(run_dir),
            "--stage", str(stage), "--output-dir", str(out),
        )  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    return {
        "vote": summary["team_vote_accuracy"],
        "best": summary["best_agent"]["accuracy"],
        SWAPPED: summary["per_agent"][SWAPPED]["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", type=int, default=7, help="the swap happens before this stage")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_swap"))
    args = parser.parse_args()
    last = load_config(None, []).trainer.stages - 1
    stages = (args.at - 1, args.at, last)

    stronger = args.out / "stronger"
    if not (stronger / "config.json").exists():
        build_tiny_model(stronger, size="quickstart", variant="carry", seed=STRONGER_SEED)
    print(f"stronger model: {stronger}")
    table = {}
    for name, overrides in runs(stronger, args.at).items():
        run_dir = args.out / f"seed{args.seed}" / RUN_DIRS[name]
        sets = [f"trainer.seed={args.seed}", *overrides]
        if not (run_dir / "agent_a0" / f"stage_{last}").is_dir():  # else: done by an earlier call
            satseq("train", "--output-dir", str(run_dir), *[a for s in sets for a in ("--set", s)])
        table[name] = {stage: held_out(run_dir, stage) for stage in stages}
        swap = read_metrics(run_dir / "metrics.jsonl")[args.at]
        table[name]["swap"] = {k.split("/")[-1]: v for k, v in swap.items() if "swap/" in k}

    print(
        f"\nheld-out (200 synthetic:test problems), seed {args.seed}, swap before stage {args.at}"
    )
    header = "".join(f"{f'stage {s}: vote / best / {SWAPPED}':>34}" for s in stages)
    print(f"{'run':<12}{header}   swap: λ, KL after, steps")
    for name, row in table.items():
        cells = "".join(
            f"{row[s]['vote']:>16.3f} / {row[s]['best']:.3f} / {row[s][SWAPPED]:.3f}"
            for s in stages
        )
        swap = row["swap"]
        swap_cell = f"{swap['lambda']:.2f}, {swap['kl']:.3f}, {swap['steps']}" if swap else "-"
        print(f"{name:<12}{cells}   {swap_cell}")
    results = args.out / f"seed{args.seed}" / "results.json"
    results.write_text(json.dumps({n: {str(k): v for k, v in r.items()} for n, r in table.items()}))
    print(f"\nresults: {results}")


if __name__ == "__main__":
    main()
