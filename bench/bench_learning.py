"""Does training help, beyond noise? Each run (a config and its settings) is trained on several
seeds with `satseq train`; its team is scored before training (the base team, once: greedy
evaluation makes it the same for every seed) and after the last stage with `satseq eval
--against`, on the same held-out problems. It prints, per run and seed and pooled over the
seeds, the held-out team vote, the best single agent, the problems gained and lost, McNemar's
exact p and the 95 % interval of the vote's change (`satseq.evaluation.compare.PooledVotes`),
and the tokens the engines generated (runs are compared at equal generated tokens); writes each
seed's record to `--results` (JSON lines) and the training curves of every record there (reward
per stage, the mean over seeds) to a PNG beside it. A record holds all the report needs (the
paired counts, the curve, and the team's vote on each problem), so `--report` reads no scratch
directory: keep the records under bench/results/. Not a timed test: it prints numbers.

    python bench/bench_learning.py --run "sat_seq=configs/smollm2.yaml" \\
        --run "grpo=configs/smollm2_grpo.yaml" \\
        --run "alone=configs/smollm2.yaml team.agents=[{name: a0, path: builtin:smollm2-135m}]" \\
        --seeds 0 1 2 --results bench/results/learning_smollm2.jsonl

A run is `LABEL=CONFIG` followed by KEY=VALUE overrides (YAML values, as `--set` takes them),
separated by spaces outside brackets and quotes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench_lora_team import SATSEQ, base_team, eval_summary, run

from satseq.algo.eval_metrics import wilson_interval
from satseq.cluster.metric_keys import RUN_TOKENS, stage_tokens
from satseq.config import TRAIN_CONFIG, RunConfig, load_config
from satseq.evaluation.compare import PairedVotes, PooledVotes, paired_votes, read_team_votes
from satseq.report import read_metrics


def split_outside_brackets(text: str) -> list[str]:
    """`text` split at whitespace that is outside brackets and quotes (a YAML value stays whole:
    `team.agents=[{name: a0, path: x}]` is one part)."""
    parts, current, depth, quote = [], "", 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char.isspace() and depth == 0:
            parts, current = ([*parts, current] if current else parts), ""
            continue
        current += char
    return [*parts, current] if current else parts


@dataclass(frozen=True)
class Run:
    label: str
    config: Path
    overrides: list[str]


def parse_run(text: str) -> Run:
    """`LABEL=CONFIG KEY=VALUE ...` → a Run."""
    head, *overrides = split_outside_brackets(text)
    label, _, config = head.partition("=")
    if not label or not config:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=CONFIG [KEY=VALUE ...]")
    return Run(label, Path(config), overrides)


def settings(run_: Run, seed: int | None = None) -> list[str]:
    """The run's overrides, and its seed when one is given."""
    return [*run_.overrides, *([f"trainer.seed={seed}"] if seed is not None else [])]


def eval_flags(run_: Run) -> list[str]:
    """`--set` flags that score every team of `run_` as its config says (`eval.*`), whatever the
    team's own train_config.yaml holds."""
    section = load_config(run_.config, settings(run_)).eval.model_dump()
    return [
        part
        for key, value in section.items()
        for part in ("--set", f"eval.{key}={json.dumps(value)}")
    ]


def base_team_settings(run_: Run) -> list[str]:
    """The overrides its base team is scored with: the run's, and its first agent alone when
    every agent starts as the same model (the same settings but the name), sees the same prompt
    (the mixture topology) and the evaluation is greedy, so each would give the same answers:
    the vote of identical answers is that answer, at a third of the generation for three."""
    config = load_config(run_.config, settings(run_))
    first, *others = [agent.model_dump(exclude={"name"}) for agent in config.team.agents]
    alike = config.team.topology == "mixture" and all(agent == first for agent in others)
    if config.eval.temperature > 0 or not alike:
        return run_.overrides
    return [*run_.overrides, f"team.agents=[{json.dumps(config.team.agents[0].model_dump())}]"]


def training_settings(config: RunConfig) -> dict:
    """The resolved config but for what does not change the trained weights: when checkpoints
    are written (`trainer.save_every`) and how a team is scored (`eval`)."""
    resolved = config.model_dump()
    del resolved["trainer"]["save_every"], resolved["eval"]
    return resolved


def trained_already(out: Path, run_: Run, seed: int) -> bool:
    """`out` holds `run_` trained on `seed` to its end by an earlier invocation: its
    train_config.yaml resolves to the same training settings and it logged every stage (or
    those that spent its `trainer.max_generated_tokens`)."""
    if not (out / TRAIN_CONFIG).is_file() or not (out / "metrics.jsonl").is_file():
        return False
    wanted = load_config(run_.config, settings(run_, seed))
    if training_settings(load_config(out / TRAIN_CONFIG)) != training_settings(wanted):
        return False
    stages = read_metrics(out / "metrics.jsonl")
    tokens = stages[-1].get(RUN_TOKENS, 0) if stages else 0
    return wanted.trainer.run_ends(len(stages), tokens)


def train_and_score(
    run_: Run, seed: int, root: Path, base_eval: Path, dataset: str, reuse: bool = False
) -> dict:
    """Train `run_` on `seed` (or, with `reuse`, keep the run an earlier invocation trained
    there); its evaluation on `dataset` against the base team's, and its curves."""
    out = root / f"{run_.label}-seed{seed}"
    reused, train_s = reuse and trained_already(out, run_, seed), None
    if not reused:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        sets = [part for setting in settings(run_, seed) for part in ("--set", setting)]
        _, train_s = run([SATSEQ, "train", str(run_.config), *sets, "--output-dir", str(out)],
                         out / "train.log")  # fmt: skip
    summary = eval_summary(out, out / "eval_last", out / "eval_last.log", "--against",
                           str(base_eval), *eval_flags(run_), dataset=dataset)  # fmt: skip
    stages = read_metrics(out / "metrics.jsonl")
    return {
        "run": run_.label,
        "seed": seed,
        "dataset": dataset,
        "reused": reused,
        "train_s": train_s,  # None: trained by an earlier invocation
        # with dynamic sampling's dropped groups: what the run cost (runs compare at equal tokens)
        "tokens_generated": sum(stage_tokens(stage) for stage in stages),
        "reward_per_stage": [stage.get("reward/mean") for stage in stages],
        "vote": summary["team_vote_accuracy"],
        "best_agent": max(agent["accuracy"] for agent in summary["per_agent"].values()),
        "against": summary["against"],  # paired with the base team's evaluation
        "team_votes": packed_votes(read_team_votes(out / "eval_last")),
    }


def packed_votes(votes: dict[str, bool]) -> dict[str, str]:
    """problem id → vote correct, as a record keeps it: a digest of the sorted ids, and a 0/1
    character a problem in that order."""
    ids = sorted(votes)
    return {
        "problems": hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16],
        "correct": "".join("1" if votes[i] else "0" for i in ids),
    }


def paired_records(before: dict, after: dict) -> PairedVotes:
    """`after`'s team vote paired problem by problem with `before`'s (records of the same
    problems: their packed votes' digests agree)."""
    label = f"{before['run']} seed {before['seed']}"
    b, a = before["team_votes"], after["team_votes"]
    if b["problems"] != a["problems"]:
        raise ValueError(f"{label} and {after['run']} seed {after['seed']} were scored on "
                         "other problems: pair records of the same dataset")  # fmt: skip
    return paired_votes(unpacked_votes(b), unpacked_votes(a), label)


def unpacked_votes(packed: dict[str, str]) -> dict[str, bool]:
    """Packed votes as problem position (in sorted-id order) → vote correct."""
    return {str(k): c == "1" for k, c in enumerate(packed["correct"])}


def pooled(records: list[dict], against: list[dict] | None = None) -> PooledVotes:
    """Each record's team vote paired with its base team's (the counts it holds), or with the
    record of the same seed in `against` (another run's) problem by problem, pooled over the
    seeds; pairing with another run needs both records' votes (records recovered from a
    results table hold only counts)."""
    if against is None:
        return PooledVotes([PairedVotes(**r["against"]) for r in records])
    theirs = {r["seed"]: r for r in against if r.get("team_votes")}
    return PooledVotes(
        [
            paired_records(theirs[r["seed"]], r)
            for r in records
            if r.get("team_votes") and r["seed"] in theirs
        ]
    )


def by_run(records: list[dict]) -> dict[str, list[dict]]:
    labels = dict.fromkeys(r["run"] for r in records)
    return {label: [r for r in records if r["run"] == label] for label in labels}


def with_interval(successes: int, n: int) -> str:
    low, high = wilson_interval(successes, n)
    return f"{successes / n:.3f} [{low:.3f}, {high:.3f}]"


def print_table(records: list[dict]) -> None:
    """Per seed; then per run, pooled over its seeds (the accuracies' 95 % Wilson intervals
    over every seed's problems, the change's paired one); then the first run against each
    other, seed by seed on the same problems."""
    scored_on = ", ".join(sorted({r.get("dataset", "synthetic:test") for r in records}))
    change = f"vote on {scored_on}, base → after (gained, lost; p)"
    print(f"| run | seed | {change} | best agent | tokens |")
    print("|---|---|---|---|---|")
    for r in records:
        a = r["against"]
        print(
            f"| {r['run']} | {r['seed']} | {a['accuracy_before']:.3f} → {r['vote']:.3f} "
            f"({a['gained']}, {a['lost']}; p {a['p_value']:.2g}) | {r['best_agent']:.3f} "
            f"| {r['tokens_generated']} |"
        )
    print("\n| run | seeds | team vote [95 %] | change from base [95 %] (p) | best agent [95 %] "
          "| tokens a seed |\n|---|---|---|---|---|---|")  # fmt: skip
    for label, mine in by_run(records).items():
        sizes = [r["against"]["num_problems"] for r in mine]
        n, right = sum(sizes), sum(round(r["vote"] * k) for r, k in zip(mine, sizes, strict=True))
        best = sum(round(r["best_agent"] * k) for r, k in zip(mine, sizes, strict=True))
        change = pooled(mine)
        low, high = change.interval
        tokens = statistics.mean(r["tokens_generated"] for r in mine)
        print(
            f"| {label} | {len(mine)} | {with_interval(right, n)} "
            f"| {change.difference:+.3f} [{low:+.3f}, {high:+.3f}] (p {change.p_value:.2g}) "
            f"| {with_interval(best, n)} | {tokens:.0f} |"
        )
    for label, mine in by_run(records).items():
        print(f"{label}: {pooled(mine).describe()}")
    first, *others = by_run(records).items()
    for label, theirs in others:
        if (against := pooled(first[1], theirs)).runs:
            print(f"{first[0]} against {label}: {against.describe()}")


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def plot_curves(records: list[dict], path: Path) -> None:
    """Reward per stage, the mean over each run's seeds, one line a run (the seeds with a
    curve); nothing drawn when no record has one."""
    curves = {
        label: found
        for label, mine in by_run(records).items()
        if (found := [r["reward_per_stage"] for r in mine if r["reward_per_stage"]])
    }
    if not curves:
        print(f"no record has a curve: {path} not drawn")
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for label, found in curves.items():
        stages = min(len(c) for c in found)
        mean = [statistics.mean(c[k] for c in found) for k in range(stages)]
        axes.plot(range(stages), mean, marker="o", label=f"{label} ({len(found)} seeds)")
    axes.set_xlabel("stage")
    axes.set_ylabel("reward of the groups trained on (seed mean)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", dest="runs", type=parse_run, action="append", default=[])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="/tmp/bench_learning")
    parser.add_argument(
        "--dataset",
        default="synthetic:test",
        help="what the teams are scored on: the held-out split for a report, or a validation "
        "slice for tuning (synthetic:warmup: disjoint from train and test; only the builtin tiny "
        "models were warm-started on it)",
    )
    parser.add_argument("--results", type=Path, default=Path("/tmp/bench_learning.jsonl"))
    parser.add_argument(
        "--report",
        action="store_true",
        help="train nothing: the table, pooled lines and curves of every record in --results "
        "(seeds trained by several invocations, maybe on other machines)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="score a seed's run that an earlier invocation trained to its last stage in "
        "--out/LABEL-seedN with the same settings (trainer.save_every and eval aside) instead "
        "of training it again, and keep a base team's evaluation already in --out/LABEL/eval_base",
    )
    args = parser.parse_args()
    if args.report:
        records = read_records(args.results)
        print_table(records)
        plot_curves(records, args.results.with_suffix(".png"))
        return
    if not args.runs:
        parser.error("give at least one --run LABEL=CONFIG (or --report)")
    root = Path(args.out)
    records = []
    for run_ in args.runs:
        base_eval = root / run_.label / "eval_base"
        if not (args.reuse and (base_eval / "summary.json").is_file()):
            base = base_team(run_.config, base_team_settings(run_), root / run_.label)
            eval_summary(base, base_eval, root / run_.label / "eval_base.log",
                         *eval_flags(run_), dataset=args.dataset)  # fmt: skip
        for seed in args.seeds:
            records.append(
                train_and_score(run_, seed, root, base_eval, args.dataset, reuse=args.reuse)
            )
            with args.results.open("a") as results:
                results.write(json.dumps(records[-1]) + "\n")
    print_table(records)
    # the PNG is --results's: every record there, earlier invocations' seeds too
    plot_curves(read_records(args.results), args.results.with_suffix(".png"))


if __name__ == "__main__":
    main()
