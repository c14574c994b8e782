"""GRPO on the tiny model: satseq's stage against TRL's `GRPOTrainer` step, side by side.

Both sides train the project's own tiny model (`builtin:tiny-carry-0`, an HF directory in the
model cache that TRL loads by its local path; nothing is downloaded) on the same prompts, in the
same order: B quickstart `train` problems a step, drawn by satseq's data cursor and handed to
TRL as an unshuffled dataset, each rendered by satseq's chat template. Same group size G,
completion length, learning rate (constant), temperature 1, one optimiser step per batch over
the whole batch at once (TRL: per-device batch B·G, one iteration; satseq: one update step,
one micro-batch of B·G), token-mean PPO-clip with ε = 0.2 and no KL term, gradient-norm clip 1,
float32 on the CPU, and the same reward (satseq's `RewardScorer`). TRL generates with
transformers' `generate` (no vLLM).

Each side runs in its own process, `--repeats` times, alternating. satseq is `satseq train`'s
coordinator on a local Ray instance sized to the machine (2 cores here): the learner's bundle
holds one core, `--rollout-actors` rollout actors share the other (each generating and scoring
its share of the prompts), and the learner computes on both cores while they wait. TRL is one
process with torch's default threads. Per step: seconds from one step's end to the next's
(satseq: a coordinator `run_stage` call, its resume checkpoint included; HF directories are
written after the last stage only, and TRL writes none), the median over steps 2..N of every
run; wall: from before Ray starts (satseq) or the trainer is built (TRL) to the end of step N,
imports excluded. Not a timed test: it prints numbers and writes them to
bench/results/grpo_trl.txt.

    .venv/bin/python bench/bench_grpo_trl.py [--steps 8] [--prompts 4] [--group-size 8] \
        [--max-new-tokens 48] [--lr 1e-5] [--repeats 3] [--rollout-actors 2]

TRL comes with the `bench` extra: pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from satseq.config import RunConfig, load_config

MODEL = "builtin:tiny-carry-0"
RESULTS = Path(__file__).parent / "results" / "grpo_trl.txt"
SIDES = ("satseq", "trl")
PER_STEP = "per step, s (median, 2..N)"


def run_config(args, output_dir: str) -> RunConfig:
    """The satseq run: GRPO, one agent, the quickstart's data and reward, no validation."""
    B, G = args.prompts, args.group_size
    return load_config(
        None,
        [
            "algorithm.name=grpo",
            f"team.agents=[{{name: policy, path: '{MODEL}'}}]",
            f"trainer.batch_size={B}",
            f"grpo.group_size={G}",
            f"rollout.max_new_tokens={args.max_new_tokens}",
            f"trainer.lr={args.lr}",
            "trainer.update_steps=1",
            f"trainer.micro_batch_size={B * G}",
            f"trainer.stages={args.steps}",
            f"trainer.save_every={args.steps}",  # HF directories after the last stage only
            "trainer.resources.num_cpus=1",
            f"rollout.num_actors={args.rollout_actors}",
            f"rollout.resources.num_cpus={1 / args.rollout_actors}",
            "data.val_files=[]",
            "output.tensorboard=false",
            f"output.dir={output_dir}",
        ],
    )


def step_seconds(ends: list[float], started: float) -> list[float]:
    """Each step's seconds, from the previous step's end (the first: from `started`)."""
    return [end - start for start, end in zip([started, *ends[:-1]], ends, strict=True)]


def run_satseq(args, out: Path) -> dict:
    import ray

    from satseq.cluster.coordinator import CoordinatorActor
    from satseq.launch.connection import connect

    config = run_config(args, str(out))
    started = time.perf_counter()
    connect(None)
    coordinator = CoordinatorActor.remote(config, str(out / "run"), False)
    ray.get(coordinator.next_stage.remote())  # the team is up
    team_started = time.perf_counter()
    ends, rewards = [], []
    for _ in range(args.steps):
        rewards.append(ray.get(coordinator.run_stage.remote())["reward/mean"])
        ends.append(time.perf_counter())
    ray.get(coordinator.close.remote())
    return {
        "steps": step_seconds(ends, team_started),
        "wall": ends[-1] - started,
        "startup": team_started - started,
        "rewards": rewards,
    }


def training_prompts(args, config: RunConfig, tokenizer) -> list[dict]:
    """The problems satseq's stages draw, in its order, as TRL dataset rows: the prompt text
    (satseq's chat template), the problem and its answer (for the reward)."""
    from satseq.cluster.builders import training_problems
    from satseq.data import build_prompt
    from satseq.data.cursor import PromptCursor
    from satseq.launch.builders import prompt_format

    problems = training_problems(config)
    cursor = PromptCursor(len(problems), config.trainer.seed)
    drawn = [problems[i] for _ in range(args.steps) for i in cursor.next(args.prompts)]
    fmt = prompt_format(config)
    return [
        {"prompt": build_prompt(tokenizer, p, fmt), "problem": p.problem, "answer": p.answer}
        for p in drawn
    ]


def run_trl(args, out: Path) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from satseq.launch.builders import reward_scorer
    from satseq.models import load_tokenizer, resolve_model_path

    config = run_config(args, str(out))
    model_dir = str(resolve_model_path(MODEL))
    scorer = reward_scorer(config)
    rewards: list[float] = []

    def reward(prompts, completions, problem, answer, **_) -> list[float]:
        scores = [float(s) for s in scorer.score_batch(problem, completions, answer).scores]
        rewards.append(sum(scores) / len(scores))
        return scores

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_train_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.ends.append(time.perf_counter())

    started = time.perf_counter()
    dataset = Dataset.from_list(training_prompts(args, config, load_tokenizer(model_dir)))
    B, G = args.prompts, args.group_size
    clock = StepClock()
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        train_dataset=dataset,
        callbacks=[clock],
        args=GRPOConfig(
            output_dir=str(out / "trl"),
            per_device_train_batch_size=B * G,
            num_generations=G,
            max_completion_length=args.max_new_tokens,
            shuffle_dataset=False,  # the rows are already in satseq's order
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            max_steps=args.steps,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            beta=0.0,
            epsilon=config.grpo.eps_low,
            loss_type="dapo",  # token mean over the batch, as satseq's GRPO
            max_grad_norm=config.trainer.grad_clip,
            gradient_checkpointing=False,
            bf16=False,
            use_cpu=True,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=config.trainer.seed,
        ),
    )
    trainer.train()
    scorer.close()
    return {
        "steps": step_seconds(clock.ends, clock.started),
        "wall": clock.ends[-1] - started,
        "startup": clock.started - started,
        "rewards": rewards,
    }


def summary(runs: list[dict], steps: int) -> dict[str, float]:
    """One side's runs: the median step over steps 2..N of every run (the steady state), the
    median first step, start-up and wall, and the mean training reward."""
    rewards = [reward for run in runs for reward in run["rewards"]]
    return {
        PER_STEP: median([s for run in runs for s in run["steps"][1:]]),
        "first step, s": median([run["steps"][0] for run in runs]),
        "start-up, s": median([run["startup"] for run in runs]),
        f"wall for {steps} steps, s": median([run["wall"] for run in runs]),
        "mean reward": sum(rewards) / len(rewards),
    }


def report(args, runs: dict[str, list[dict]], load: tuple[float, float]) -> str:
    sides = {side: summary(runs[side], args.steps) for side in SIDES}
    ratio = sides["satseq"][PER_STEP] / sides["trl"][PER_STEP]
    lines = [
        f"GRPO on {MODEL}: {args.prompts} prompts × G {args.group_size}, up to "
        f"{args.max_new_tokens} new tokens, lr {args.lr}, {args.steps} steps; {args.repeats} "
        f"runs a side, alternating, on {os.cpu_count()} cores (load average {load[0]:.1f} "
        f"before, {load[1]:.1f} after); satseq with {args.rollout_actors} rollout actors",
        f"{'':28}{'satseq':>9}{'TRL':>9}",
        *(
            f"{label:28}{sides['satseq'][label]:9.3f}{sides['trl'][label]:9.3f}"
            for label in sides["satseq"]
        ),
        f"per step satseq/TRL: {ratio:.2f} (satseq {1 / ratio:.2f}x TRL's speed)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="B prompts a step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--repeats", type=int, default=3, help="runs a side")
    parser.add_argument("--rollout-actors", type=int, default=2, help="satseq's, on one core")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        run = run_satseq if args.side == "satseq" else run_trl
        print(json.dumps(run(args, Path(args.out))))
        return

    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for side in SIDES:
            with tempfile.TemporaryDirectory() as tmp:
                command = [sys.executable, __file__, *sys.argv[1:], "--side", side, "--out", tmp]
                out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[side].append(json.loads(out.strip().splitlines()[-1]))
    text = report(args, runs, (load_before, os.getloadavg()[0]))
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([".venv/bin/python bench/bench_grpo_trl.py", *sys.argv[1:]])
    RESULTS.write_text(f"# {command}\n{text}\n")


if __name__ == "__main__":
    main()
