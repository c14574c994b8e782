"""SPO against GRPO on the quickstart task and model: one agent, the same generated-token budget.

1. SPO's offline values come from the pipeline: `satseq offline-values estimate` (the base model,
   n0 = 8 samples per training prompt) and `satseq offline-values merge`.
2. Both methods train with the real `satseq train` from `builtin:tiny` on the same training
   prompts and see the same number of samples per stage: GRPO B prompts × G = 8, SPO 8·B
   prompts × 1. Every stage the policy is evaluated (the `satseq eval` code, K = 4 samples at
   T 0.6) on all the training prompts, which is the reward the curves show: the batch reward
   is not comparable, since SPO chooses which prompts it trains on. The same is done on 64
   held-out problems, to show what the tiny model generalises.
3. Curves against generated tokens and against training wall time (validation excluded) go to
   a PNG and a JSON; the printout gives SPO's tokens to reach GRPO's final reward ÷ GRPO's.

Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_spo_vs_grpo.py [--stages 15] [--out outputs/bench_spo_vs_grpo]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from satseq.data import make_split
from satseq.report import read_metrics

SATSEQ = str(Path(sys.executable).parent / "satseq")
N_TRAIN = 96  # training prompts (synthetic split 'test', which the warm start never saw)
G = 8
TRAIN_PHASES = ("time/sample", "time/rollout", "time/logprobs", "time/update", "time/tracker")


def satseq(*args: str) -> None:
    subprocess.run([SATSEQ, *args], check=True)


def common_settings(prompts_per_stage: int, stages: int, val_file: str) -> list[str]:
    settings = {
        "team.agents": "[{name: policy, path: 'builtin:tiny'}]",
        "data.synthetic.n_train": N_TRAIN,
        "data.val_files": f"['{val_file}']",
        "eval.synthetic_problems": 64,
        "eval.samples_per_agent": 4,
        "trainer.val_every": 1,
        "trainer.stages": stages,
        "trainer.batch_size": prompts_per_stage,
        "trainer.save_every": 1,
        # plain PPO steps (no trust region) at the quickstart's 3e-4 and 2 steps collapse the
        # tiny policy within a few stages, for both methods
        "trainer.lr": 2e-4,
        "trainer.update_steps": 1,
        "output.tensorboard": "false",
    }
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def training_prompts_file(out: Path) -> Path:
    """The quickstart's training problems (data.synthetic, n_train = N_TRAIN) as a JSONL."""
    data_file = out / "train.jsonl"
    problems = make_split("test", N_TRAIN, seed=0, difficulty=1, style="symbols")
    data_file.write_text(
        "".join(json.dumps({"problem": p.problem, "answer": p.answer}) + "\n" for p in problems)
    )
    return data_file


def offline_values(out: Path, data_file: Path) -> Path:
    """The seeds' three steps on the training prompts, with the base model."""
    estimates = out / "offline"
    satseq(
        "offline-values", "estimate", "--data_file", str(data_file),
        "--model_path", "builtin:tiny", "--output_dir", str(estimates), "--n_samples", "8",
        "--exp_name", "offline_value_estimation_subset_0",
    )  # fmt: skip
    values = out / "offline_values.json"
    satseq("offline-values", "merge", "--input_dir", str(estimates), "--output_file", str(values))
    return values


def curve(run_dir: Path) -> dict[str, list[float]]:
    metrics = read_metrics(run_dir / "metrics.jsonl")
    return {
        "tokens": np.cumsum([m["tokens/generated"] for m in metrics]).tolist(),
        "wall_s": np.cumsum([sum(m.get(k, 0.0) for k in TRAIN_PHASES) for m in metrics]).tolist(),
        "val_reward": [m["val/avg@k"] for m in metrics],
        "train_reward": [m["reward/mean"] for m in metrics],
        "near_zero_advantage": [m["advantage/near_zero_fraction"] for m in metrics],
        "degenerate_groups": [m.get("groups/degenerate_fraction", float("nan")) for m in metrics],
    }


def held_out_reward(run_dir: Path) -> list[float]:
    """avg@4 on 64 held-out problems (`satseq eval`) after the first and after the last stage."""
    rewards = []
    for stage in ("0", None):
        out = run_dir / f"held_out_{stage or 'last'}"
        satseq(
            "eval", "--dataset", "synthetic:test", "--checkpoint-dir", str(run_dir),
            "--output-dir", str(out), *(["--stage", stage] if stage else []),
        )  # fmt: skip
        rewards.append(json.loads((out / "summary.json").read_text())["avg@k"])
    return rewards


def tokens_to_reach(c: dict[str, list[float]], target: float) -> float | None:
    for tokens, reward in zip(c["tokens"], c["val_reward"], strict=True):
        if reward >= target:
            return tokens
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=15)
    parser.add_argument("--grpo-prompts", type=int, default=4, help="SPO gets 8x as many")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_spo_vs_grpo"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    data_file = training_prompts_file(args.out)
    values = offline_values(args.out, data_file)
    grpo_dir, spo_dir = args.out / "grpo", args.out / "spo"
    satseq(
        "train", "--output-dir", str(grpo_dir), "--set", "algorithm.name=grpo",
        "--set", f"grpo.group_size={G}",
        *common_settings(args.grpo_prompts, args.stages, str(data_file)),
    )  # fmt: skip
    satseq(
        "train", "--output-dir", str(spo_dir), "--set", "algorithm.name=spo",
        "--set", f"spo.offline_values={values}", "--set", "spo.candidate_pool_size=64",
        *common_settings(G * args.grpo_prompts, args.stages, str(data_file)),
    )  # fmt: skip
    held_out = {name: held_out_reward(run) for name, run in (("grpo", grpo_dir), ("spo", spo_dir))}

    curves = {"grpo": curve(grpo_dir), "spo": curve(spo_dir)}
    budget = min(c["tokens"][-1] for c in curves.values())
    grpo_final = curves["grpo"]["val_reward"][-1]
    spo_tokens = tokens_to_reach(curves["spo"], grpo_final)
    result = {
        "token_budget": budget,
        "grpo_final_val_reward": grpo_final,
        "spo_final_val_reward": curves["spo"]["val_reward"][-1],
        "spo_tokens_to_grpo_final": spo_tokens,
        "grpo_tokens_to_grpo_final": tokens_to_reach(curves["grpo"], grpo_final),
        "tokens_ratio_spo_over_grpo": spo_tokens / curves["grpo"]["tokens"][-1]
        if spo_tokens
        else None,
        "mean_degenerate_group_fraction_grpo": float(np.mean(curves["grpo"]["degenerate_groups"])),
        "mean_near_zero_advantage_fraction": {
            name: float(np.mean(c["near_zero_advantage"])) for name, c in curves.items()
        },
        "wall_s": {name: c["wall_s"][-1] for name, c in curves.items()},
        "held_out_reward_first_and_last_stage": held_out,
        "curves": curves,
    }
    (args.out / "spo_vs_grpo.json").write_text(json.dumps(result, indent=2) + "\n")

    figure, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        by_tokens.plot(c["tokens"], c["val_reward"], marker="o", label=name.upper())
        by_time.plot(c["wall_s"], c["val_reward"], marker="o", label=name.upper())
    by_tokens.axvline(budget, color="grey", linestyle=":", label="common token budget")
    by_tokens.set_xlabel("generated tokens")
    by_time.set_xlabel("training wall time (s)")
    for axis in (by_tokens, by_time):
        axis.set_ylabel("reward on the training prompts (avg@4, T 0.6)")
        axis.legend()
    figure.suptitle("SPO vs GRPO, quickstart task, builtin:tiny, one agent")
    figure.tight_layout()
    figure.savefig(args.out / "spo_vs_grpo.png", dpi=120)

    print(json.dumps({k: v for k, v in result.items() if k != "curves"}, indent=2))
    print(f"wrote {args.out / 'spo_vs_grpo.png'} and {args.out / 'spo_vs_grpo.json'}")


if __name__ == "__main__":
    main()
