"""The bandit certificate on the quickstart: how often it is positive, and what it would take.

For each held-out fraction (`algorithm.certificate.holdout_fraction`), the SAT-Seq recipe trains
the quickstart team (configs/quickstart.yaml) in this process: `start_in_process` runs the same
recipe, learners and rollout worker as `satseq train`, without Ray. The held-out fraction changes
the run (fewer prompts train, more certify). `w_max` only enters the bound, so every stage's bound
is computed at each `w_max` of the sweep from the same held-out trajectories, with the
certificate's own function (`satseq.algo.bandit_lower_bound`); at the config's `w_max` it is
checked against the value the recipe logged. Nothing about the bound is loosened: the table also
projects each stage's bound to 10, 100 and 1000 times as many held-out prompts with the same
statistics (the prompts repeated), which says how far the sizes of the quickstart are from an
informative bound.

`--coverage` instead simulates stages whose prompts' G samples are correlated
(`certificate_coverage.py`) and prints `coverage: X` for G = 1, 4 and 16: the share of stages
whose bound held, which must be ≥ 1 − δ_conf, with the prompt as the unit of independence (and,
for comparison, with every sample taken as independent), and how often it is positive when
the true gain is.

Columns: n held-out prompts per stage; positive: stages with a bound > 0, at n, 10·n,
100·n and 1000·n; the mean bound, its mean estimate Ê[(w̄ − 1)(R − b)], deviation (PAC radius) and
truncation-bias terms, and the best stage's bound. Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_certificate.py [--stages 15] [--holdout 0.25 0.5 0.75] \
        [--w-max 1.1 1.25 1.5 2 4] [--seed 0]
    .venv/bin/python bench/bench_certificate.py --coverage [--simulated-stages 2000]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from certificate_coverage import DELTA, coverage

from satseq.algo import bandit_lower_bound
from satseq.cluster.recipes import RECIPES
from satseq.cluster.recipes import sat_seq as sat_seq_recipe
from satseq.cluster.recipes.certificate import R_MAX, R_MIN, HeldOut
from satseq.cluster.team import start_in_process
from satseq.cluster.training_data import training_problems
from satseq.config import QUICKSTART, RunConfig, load_config

PROJECTIONS = (1, 10, 100, 1000)  # held-out samples, as multiples of a stage's


@dataclass(frozen=True)
class Stage:
    """One stage's certifying trajectories (`certificate.HeldOut`), the team's size, the
    baseline b the recipe fixed before sampling, and the bound the recipe logged."""

    held_out: HeldOut
    n_agents: int
    baseline: float
    logged_bound: float


class HeldOutRecorder:
    """Stands in for the recipe's `team_certificate`: returns what it returns, and keeps each
    stage's held-out trajectories."""

    def __init__(self, certificate):
        self.certificate = certificate
        self.stages: list[Stage] = []

    def __call__(self, config, held_out, n_agents, baseline_reward):
        result = self.certificate(config, held_out, n_agents, baseline_reward)
        self.stages.append(Stage(held_out, n_agents, baseline_reward, result["lower_bound"]))
        return result


@contextmanager
def recording_held_out() -> Iterator[HeldOutRecorder]:
    """The SAT-Seq recipe's certificate step, recorded for the duration of the block."""
    recorder = HeldOutRecorder(sat_seq_recipe.team_certificate)
    sat_seq_recipe.team_certificate = recorder
    try:
        yield recorder
    finally:
        sat_seq_recipe.team_certificate = recorder.certificate


def train_quickstart(holdout_fraction: float, stages: int, seed: int) -> tuple[RunConfig, list]:
    """Train the quickstart team in this process; its config and each stage's held-out data."""
    config = load_config(
        QUICKSTART,
        [
            f"algorithm.certificate.holdout_fraction={holdout_fraction}",
            f"trainer.stages={stages}",
            f"trainer.seed={seed}",
            f"data.synthetic.seed={seed}",
            "trainer.val_every=0",
        ],
    )
    recipe_class = RECIPES["sat_seq"]
    runtime = start_in_process(config, recipe_class.learner_settings(config))
    recipe = recipe_class(config, runtime, training_problems(config))
    with recording_held_out() as recorder:
        for stage in range(stages):
            recipe.run_stage(stage)
    return config, recorder.stages


def bound(config: RunConfig, stage: Stage, w_max: float, repeats: int = 1):
    """The certificate's bound on the stage's held-out prompts (each repeated `repeats` times,
    the copies counting as new prompts) at `w_max`."""
    cert = config.algorithm.certificate
    held_out = stage.held_out
    prompts = held_out.prompts
    copies = torch.cat([prompts + k * (int(prompts.max()) + 1) for k in range(repeats)])
    return bandit_lower_bound(
        held_out.log_ratio(list(range(stage.n_agents))).repeat(repeats),
        held_out.R.repeat(repeats),
        b=stage.baseline,
        R_min=R_MIN,
        R_max=R_MAX,
        w_max=w_max,
        delta_conf=cert.delta_conf,
        inequality=cert.inequality,
        prompts=copies,
    )


def check_against_the_recipe(config: RunConfig, stages: list[Stage]) -> None:
    """At the config's w_max, the bound recomputed here is the one the recipe logged."""
    for stage in stages:
        recomputed = bound(config, stage, config.algorithm.certificate.w_max).lower_bound
        assert math.isclose(recomputed, stage.logged_bound, rel_tol=1e-6, abs_tol=1e-9)


def sweep_row(config: RunConfig, stages: list[Stage], w_max: float) -> dict[str, object]:
    """The table's numbers for one (held-out fraction, w_max)."""
    at_n = [bound(config, stage, w_max) for stage in stages]
    positive = [
        sum(bound(config, stage, w_max, k).lower_bound > 0 for stage in stages) for k in PROJECTIONS
    ]
    return {
        "n": at_n[0].n,
        "positive": positive,
        "bound": sum(c.lower_bound for c in at_n) / len(at_n),
        "estimate": sum(c.estimate for c in at_n) / len(at_n),
        "deviation": sum(c.deviation for c in at_n) / len(at_n),
        "truncation": sum(c.truncation_bias for c in at_n) / len(at_n),
        "best": max(c.lower_bound for c in at_n),
    }


def print_table(rows: list[tuple[float, float, dict[str, object]]], stages: int) -> None:
    header = (
        f"{'holdout':>7} {'w_max':>5} {'n':>4} {'positive at n/10n/100n/1000n':>29} "
        f"{'bound':>7} {'estimate':>8} {'deviation':>9} {'trunc.':>7} {'best':>7}"
    )
    print(header)
    for holdout, w_max, r in rows:
        positive = " / ".join(f"{count}/{stages}" for count in r["positive"])
        print(
            f"{holdout:>7.2f} {w_max:>5.2f} {r['n']:>4} {positive:>29} {r['bound']:>7.3f} "
            f"{r['estimate']:>8.4f} {r['deviation']:>9.3f} {r['truncation']:>7.3f} "
            f"{r['best']:>7.3f}"
        )


def print_coverage(simulated_stages: int) -> None:
    """`coverage: X` for G = 1, 4, 16 at 256 and 512 held-out prompts of heterogeneous rates
    moved ±0.2 (true gain ≈ 0; by prompt, and by sample for comparison), and how often the bound
    is positive where they gain ≈ 0.1."""
    print(f"δ_conf {DELTA}: the bound must hold in ≥ {1 - DELTA:.2f} of the stages")
    columns = ("G", 3), ("prompts", 7), ("true gain", 9), ("by prompt", 10), ("by sample", 10)
    print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'positive':>8}")
    for G in (1, 4, 16):
        for n in (256, 512):
            by_prompt = coverage(G, n, stages=simulated_stages)
            by_sample = coverage(G, n, stages=simulated_stages, by_prompt=False)
            gaining = coverage(G, n, shift=0.1, drift=0.1, stages=simulated_stages // 10)
            print(
                f"{G:>3} {n:>7} {by_prompt.true_gain:>9.3f} {by_prompt.coverage:>10.4f} "
                f"{by_sample.coverage:>10.4f} {'':>8}"
            )
            print(
                f"{G:>3} {n:>7} {gaining.true_gain:>9.3f} {gaining.coverage:>10.4f} {'':>10} "
                f"{gaining.positive:>8.3f}"
            )
            print(f"coverage: {by_prompt.coverage:.4f} (G {G}, {n} prompts)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=load_config(QUICKSTART).trainer.stages)
    parser.add_argument("--holdout", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--w-max", type=float, nargs="+", default=[1.1, 1.25, 1.5, 2.0, 4.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--coverage", action="store_true", help="the correlated-groups simulation")
    parser.add_argument("--simulated-stages", type=int, default=2000)
    args = parser.parse_args()
    if args.coverage:
        print_coverage(args.simulated_stages)
        return

    rows = []
    for holdout in args.holdout:
        started = time.perf_counter()
        config, stages = train_quickstart(holdout, args.stages, args.seed)
        check_against_the_recipe(config, stages)
        print(f"holdout {holdout}: {args.stages} stages in {time.perf_counter() - started:.0f}s")
        rows += [(holdout, w_max, sweep_row(config, stages, w_max)) for w_max in args.w_max]
    cert = config.algorithm.certificate
    print(f"\nbandit lower bound per stage ({cert.inequality}, δ_conf {cert.delta_conf})")
    print_table(rows, args.stages)


if __name__ == "__main__":
    main()
