"""DAPO dynamic sampling against the same run without it (algorithms "DAPO dynamic sampling"):
generated tokens and wall time to reach the held-out team vote that the run without it reaches
after its last stage.

For each config and seed, `satseq train` runs twice as a user runs it, without and with
`rollout.dynamic_sampling.enabled` (same seed, same prompts in the same order). The target is the
held-out vote (`satseq eval --dataset synthetic:test`, greedy) of the run without it after its
last stage; the run with it is evaluated at its last stage and, if that reaches the target,
stage by stage from the first until one does. Generated tokens are what the engines generated
for training: `tokens/generated` (the groups trained on) plus `tokens/dropped` (the groups
dynamic sampling dropped); wall time is the sum of each stage's phases (`time/*`; Ray's and the
engines' start excluded, the same for both runs).

    python bench/bench_dynamic_sampling.py                         # smollm2_grpo, smollm2; 2 seeds
    python bench/bench_dynamic_sampling.py --configs configs/smollm2_grpo.yaml --seeds 0
    python bench/bench_dynamic_sampling.py --configs configs/quickstart.yaml --seeds 0 \
        --set trainer.stages=2                                     # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bench_lora_team import SATSEQ, run, stage_seconds, team_vote

from satseq.cluster.metric_keys import stage_tokens
from satseq.report import read_metrics


def cumulative(stages: list[dict]) -> list[tuple[int, float]]:
    """After each stage: (generated tokens, seconds) since the run's first stage."""
    tokens, seconds, totals = 0, 0.0, []
    for stage in stages:
        tokens += stage_tokens(stage)
        seconds += stage_seconds(stage)
        totals.append((tokens, seconds))
    return totals


def train(
    config: Path, seed: int, dynamic: bool, max_rounds: int, overrides: list[str], out: Path
) -> list[dict]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    settings = [
        *overrides,
        f"trainer.seed={seed}",
        f"rollout.dynamic_sampling.enabled={str(dynamic).lower()}",
        f"rollout.dynamic_sampling.max_rounds={max_rounds}",
    ]
    sets = [part for setting in settings for part in ("--set", setting)]
    run([SATSEQ, "train", str(config), *sets, "--output-dir", str(out)], out / "train.log")
    return read_metrics(out / "metrics.jsonl")


def measure(config: Path, seed: int, max_rounds: int, overrides: list[str], root: Path) -> dict:
    name = f"{config.stem}-seed{seed}"
    plain_out, dynamic_out = root / f"{name}-plain", root / f"{name}-dynamic"
    plain = train(config, seed, False, max_rounds, overrides, plain_out)
    dynamic = train(config, seed, True, max_rounds, overrides, dynamic_out)
    last = len(plain) - 1
    target = team_vote(plain_out, plain_out / "eval", plain_out / "eval.log", stage=last)

    def vote(stage: int) -> float:
        eval_dir, log = dynamic_out / f"eval_{stage}", dynamic_out / f"eval_{stage}.log"
        return team_vote(dynamic_out, eval_dir, log, stage)

    # the last stage first: below the target, no earlier stage needs an evaluation
    votes = {last: vote(last)}
    reached = last if votes[last] >= target else None
    for stage in range(last if reached is not None else 0):
        votes[stage] = vote(stage)
        if votes[stage] >= target:
            reached = stage
            break
    plain_tokens, plain_s = cumulative(plain)[last]
    dynamic_totals = cumulative(dynamic)
    result = {
        "run": name,
        "target_vote": target,
        "plain_tokens": plain_tokens,
        "plain_s": plain_s,
        "dynamic_votes": dict(sorted(votes.items())),
        "reached_at_stage": reached,
        "dynamic_rounds_mean": sum(s.get("groups/rounds", 1) for s in dynamic) / len(dynamic),
        "dynamic_kept_mean": sum(s.get("groups/kept", 0) for s in dynamic) / len(dynamic),
    }
    result["dynamic_tokens_all"], result["dynamic_s_all"] = dynamic_totals[last]
    if reached is not None:
        result["dynamic_tokens"], result["dynamic_s"] = dynamic_totals[reached]
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", nargs="+", default=["configs/smollm2_grpo.yaml", "configs/smollm2.yaml"]
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--max-rounds", type=int, default=3)  # the config's default
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="/tmp/bench_dynamic_sampling")
    args = parser.parse_args()
    results = [
        measure(Path(config), seed, args.max_rounds, args.overrides, Path(args.out))
        for config in args.configs
        for seed in args.seeds
    ]
    print("\n| run | target vote (plain, last stage) | reached at stage | tokens, dynamic / plain "
          "| seconds, dynamic / plain | rounds a stage |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in results:
        if r["reached_at_stage"] is None:
            reach, tokens, seconds = f"not reached (votes {r['dynamic_votes']})", "-", "-"
        else:
            reach = str(r["reached_at_stage"])
            tokens = f"{r['dynamic_tokens']} / {r['plain_tokens']} "
            tokens += f"({r['dynamic_tokens'] / r['plain_tokens']:.2f}x)"
            seconds = f"{r['dynamic_s']:.0f} / {r['plain_s']:.0f} "
            seconds += f"({r['dynamic_s'] / r['plain_s']:.2f}x)"
        print(
            f"| {r['run']} | {r['target_vote']:.2f} | {reach} | {tokens} | {seconds} "
            f"| {r['dynamic_rounds_mean']:.2f} |"
        )


if __name__ == "__main__":
    main()
