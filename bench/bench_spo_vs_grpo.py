"""SPO against GRPO on the quickstart task: one agent, held-out accuracy at equal generated tokens.

1. SPO's offline values come from the pipeline: `satseq offline-values estimate` (the base model,
   n0 = 8 samples per training prompt) and `satseq offline-values merge`.
2. Both methods train `builtin:tiny-carry-0` (the quickstart's first agent) with the real
   `satseq train` on the same `train` problems of `two_digit_sums`, and generate the same number
   of samples per stage: GRPO B prompts × G = 8, SPO 8·B prompts × 1. After every stage the
   policy is validated (the `satseq eval` code: K = 4 samples at T 0.6) on held-out
   `synthetic:test` problems, which neither the warm start nor training ever saw: avg@4 is the
   held-out accuracy of the curves, maj@4 the agent's own vote.
3. Each method runs with `--seeds` trainer seeds. The printout gives, per method, the held-out
   accuracy at the largest token budget every run reached (mean and spread over seeds), and, per
   seed, SPO's generated tokens to first reach GRPO's final held-out accuracy divided by GRPO's
   tokens; the curves go to a PNG and everything to a JSON.

Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_spo_vs_grpo.py [--stages 20] [--seeds 0 1 2] \
        [--out outputs/bench_spo_vs_grpo]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from satseq.config import load_config
from satseq.data import make_split
from satseq.report import read_metrics

SATSEQ = str(Path(sys.executable).parent / "satseq")
MODEL = "builtin:tiny-carry-0"
N_TRAIN = 512  # training prompts (synthetic split 'train'): every one gets offline values
VAL_PROBLEMS = 100
G = 8
METHODS = ("grpo", "spo")


def satseq(*args: str) -> None:
    subprocess.run([SATSEQ, *args], check=True)


def common_settings(prompts_per_stage: int, stages: int, seed: int) -> list[str]:
    settings = {
        "team.agents": f"[{{name: policy, path: '{MODEL}'}}]",
        "data.synthetic.n_train": N_TRAIN,
        "eval.synthetic_problems": VAL_PROBLEMS,
        "eval.samples_per_agent": 4,
        "trainer.val_every": 1,
        "trainer.stages": stages,
        "trainer.batch_size": prompts_per_stage,
        "trainer.save_every": stages,
        "trainer.seed": seed,
        "trainer.lr": 1e-4,  # plain PPO steps (no trust region), one a stage
        "trainer.ppo_epochs": 1,
        "output.tensorboard": "false",
    }
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def training_prompts_file(out: Path) -> Path:
    """The training problems (the quickstart's data.synthetic, n_train = N_TRAIN) as a JSONL."""
    s = load_config().data.synthetic
    problems = make_split(s.split, N_TRAIN, seed=s.seed, difficulty=s.difficulty, style=s.style)
    data_file = out / "train.jsonl"
    data_file.write_text(
        "".join(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n" for p in problems)
    )
    return data_file


def offline_values(out: Path, data_file: Path) -> Path:
    """The seeds' three steps on the training prompts, with the base model."""
    values = out / "offline_values.json"
    if values.is_file():
        return values
    estimates = out / "offline"
    satseq(
        "offline-values", "estimate", "--data_file", str(data_file), "--model_path", MODEL,
        "--output_dir", str(estimates), "--n_samples", "8",
        "--exp_name", "offline_value_estimation_subset_0",
    )  # fmt: skip
    satseq("offline-values", "merge", "--input_dir", str(estimates), "--output_file", str(values))
    return values


def train(method: str, run_dir: Path, stages: int, prompts: int, seed: int, values: Path) -> None:
    """One training run of `method` (GRPO: `prompts` × G a stage; SPO: G·`prompts` × 1)."""
    if (run_dir / "metrics.jsonl").is_file():
        return  # done by an earlier, interrupted invocation
    if method == "grpo":
        extra = ["--set", "algorithm.name=grpo", "--set", f"grpo.group_size={G}"]
        per_stage = prompts
    else:
        extra = ["--set", "algorithm.name=spo", "--set", f"spo.offline_values={values}"]
        per_stage = G * prompts
    satseq(
        "train", "--output-dir", str(run_dir), *extra,
        *common_settings(per_stage, stages, seed),
    )  # fmt: skip


def curve(run_dir: Path) -> dict[str, list[float]]:
    metrics = read_metrics(run_dir / "metrics.jsonl")
    return {
        "tokens": np.cumsum([m["tokens/generated"] for m in metrics]).tolist(),
        "held_out_avg": [m["val/avg@k"] for m in metrics],
        "held_out_vote": [m["val/maj@k"] for m in metrics],
        "train_reward": [m["reward/mean"] for m in metrics],
        "near_zero_advantage": [m["advantage/near_zero_fraction"] for m in metrics],
    }


def accuracy_at(c: dict[str, list[float]], tokens: float, key: str = "held_out_avg") -> float:
    """The held-out accuracy of the last validation at or before `tokens` generated tokens."""
    reached = [acc for t, acc in zip(c["tokens"], c[key], strict=True) if t <= tokens]
    return reached[-1] if reached else float("nan")


def tokens_to_reach(c: dict[str, list[float]], target: float) -> float | None:
    """Generated tokens at the first validation with held-out accuracy >= `target`."""
    for tokens, accuracy in zip(c["tokens"], c["held_out_avg"], strict=True):
        if accuracy >= target:
            return tokens
    return None


def token_ratio(spo: dict[str, list[float]], grpo: dict[str, list[float]]) -> float | None:
    """SPO's tokens to reach GRPO's final held-out accuracy ÷ GRPO's tokens to its last stage."""
    spo_tokens = tokens_to_reach(spo, grpo["held_out_avg"][-1])
    return spo_tokens / grpo["tokens"][-1] if spo_tokens is not None else None


def mean_spread(values: list[float]) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values):.3f} (min {min(values):.3f})"


def summarize(curves: dict[str, dict[int, dict]], seeds: list[int]) -> dict[str, object]:
    budget = min(c["tokens"][-1] for runs in curves.values() for c in runs.values())
    ratios = {seed: token_ratio(curves["spo"][seed], curves["grpo"][seed]) for seed in seeds}
    return {
        "token_budget": budget,
        "held_out_avg_at_budget": {
            m: [accuracy_at(curves[m][s], budget) for s in seeds] for m in METHODS
        },
        "held_out_vote_at_budget": {
            m: [accuracy_at(curves[m][s], budget, "held_out_vote") for s in seeds] for m in METHODS
        },
        "held_out_avg_first_stage": {
            m: [curves[m][s]["held_out_avg"][0] for s in seeds] for m in METHODS
        },
        "grpo_final_held_out_avg": [curves["grpo"][s]["held_out_avg"][-1] for s in seeds],
        "tokens_ratio_spo_over_grpo": ratios,
        "mean_near_zero_advantage_fraction": {
            m: float(np.mean([np.mean(c["near_zero_advantage"]) for c in curves[m].values()]))
            for m in METHODS
        },
    }


def plot(curves: dict[str, dict[int, dict]], budget: float, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for method, color in zip(METHODS, ("tab:blue", "tab:orange"), strict=True):
        for seed, c in curves[method].items():
            label = method.upper() if seed == min(curves[method]) else None
            axis.plot(c["tokens"], c["held_out_avg"], color=color, alpha=0.7, label=label)
    axis.axvline(budget, color="grey", linestyle=":", label="common token budget")
    axis.set_xlabel("generated tokens")
    axis.set_ylabel("held-out accuracy (avg@4, T 0.6, synthetic:test)")
    axis.set_title(f"SPO vs GRPO, two_digit_sums, {MODEL}, one line per seed")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def print_summary(result: dict[str, object], seeds: list[int]) -> None:
    print(f"common token budget: {result['token_budget']:.0f} generated tokens")
    for method in METHODS:
        first = mean_spread(result["held_out_avg_first_stage"][method])
        at_budget = mean_spread(result["held_out_avg_at_budget"][method])
        vote = mean_spread(result["held_out_vote_at_budget"][method])
        print(f"{method.upper():>5} held-out avg@4 after stage 0 {first}")
        print(f"{'':>5} at the budget: avg@4 {at_budget}, maj@4 {vote}")
    for seed in seeds:
        ratio = result["tokens_ratio_spo_over_grpo"][seed]
        grpo_final = result["grpo_final_held_out_avg"][seeds.index(seed)]
        shown = f"{ratio:.2f}" if ratio is not None else "never reached"
        print(f"seed {seed}: SPO tokens to GRPO's final {grpo_final:.3f} ÷ GRPO's tokens: {shown}")
    reached = [r for r in result["tokens_ratio_spo_over_grpo"].values() if r is not None]
    if reached:
        print(f"tokens ratio SPO/GRPO over seeds that reached it: {mean_spread(reached)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=20)
    parser.add_argument("--grpo-prompts", type=int, default=8, help="SPO gets 8x as many")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_spo_vs_grpo"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    values = offline_values(args.out, training_prompts_file(args.out))
    curves: dict[str, dict[int, dict]] = {method: {} for method in METHODS}
    for seed in args.seeds:
        for method in METHODS:
            run_dir = args.out / f"{method}_seed{seed}"
            train(method, run_dir, args.stages, args.grpo_prompts, seed, values)
            curves[method][seed] = curve(run_dir)

    result = summarize(curves, args.seeds)
    (args.out / "spo_vs_grpo.json").write_text(json.dumps({**result, "curves": curves}, indent=2))
    plot(curves, result["token_budget"], args.out / "spo_vs_grpo.png")
    print_summary(result, args.seeds)
    print(f"wrote {args.out / 'spo_vs_grpo.png'} and {args.out / 'spo_vs_grpo.json'}")


if __name__ == "__main__":
    main()
