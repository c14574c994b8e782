"""GRPO: satseq's stage against TRL's `GRPOTrainer` step, side by side, on one model.

`--model builtin:tiny-carry-0` (the default) is the project's own tiny model on the quickstart's
task; `--model builtin:smollm2-135m` is SmolLM2-135M-Instruct on `configs/smollm2_grpo.yaml`'s
prompt and sampling at the shapes that config had when this was first measured (SMOLLM2_SHAPES:
one agent, 4 prompts × G 8 at difficulty 1, no dynamic sampling, synchronous stages; up to 128
new tokens at T 0.7, lr 2e-5, gradient checkpointing; satseq rolls out with vLLM). Both models
are HF directories in the model cache that TRL loads by their local path; nothing is downloaded.
Both sides train on the same prompts in the same order: B of the config's `train` problems a
step, drawn by satseq's data cursor and handed to TRL as an unshuffled dataset, each rendered by
satseq's chat template (and the config's system prompt). Same group size G, completion length,
learning rate (constant), temperature, gradient checkpointing, one optimiser step per batch over
the whole batch at once (TRL: per-device batch B·G, one iteration; satseq: one epoch, no
mini-batches), token-mean PPO-clip with ε = 0.2 and no KL term, gradient-norm clip 1, float32 on
the CPU, and the same reward (satseq's `RewardScorer`). TRL generates with transformers'
`generate`. `--lora`: both sides train a rank-16 LoRA adapter (alpha 32, every linear layer but
the output layer) instead of the full model (satseq's `trainer.lora`, TRL's `peft_config`).

Each side runs in its own process, `--repeats` times, alternating. satseq is `satseq train`'s
coordinator on a local Ray instance sized to the machine (2 cores here); TRL's process runs at
the niceness Ray gives its workers (15), so that other jobs on a shared machine slow both sides
alike. Per step: seconds from
one step's end to the next's (satseq: a coordinator `run_stage` call, its resume checkpoint
included; HF directories are written after the last stage only, and TRL writes none), the
median over steps 2..N of every run, and its phases: satseq's rollout (generation and scoring),
update (the learner's) and weight sync, from the stage's metrics; TRL's rollout (its
`_generate_and_score_completions`: generation, scoring, any log-prob pass) and the rest of its
step (forward, backward, optimiser). Wall: from before Ray starts (satseq) or the trainer is
built (TRL) to the end of step N, imports excluded.

Then the learner alone, in one process on the same cores (`--learner-rounds`, 0 to skip): the
GRPO learner of the config (`learner_spec`, as the run builds it) on B·G trajectories of the
first B prompts with random response tokens as long as the satseq runs' mean response, its
update against a bare forward + cross-entropy + backward + AdamW loop over the same batch, the
learner's model and micro-batches (`learner_workload.bare_step`), alternating, tokens/s of each.
Not a timed test: it prints numbers and writes them to bench/results/grpo_trl*.txt.

    .venv/bin/python bench/bench_grpo_trl.py [--steps 8] [--repeats 3] [--rollout-actors 2]
    .venv/bin/python bench/bench_grpo_trl.py --model builtin:smollm2-135m [--steps 4] [--lora]

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

from learner_workload import lora_missing

from satseq.config import RunConfig, load_config

CONFIGS = {  # the model → the config its comparison runs (None: the quickstart's)
    "builtin:tiny-carry-0": None,
    "builtin:smollm2-135m": "configs/smollm2_grpo.yaml",
}
# SmolLM2's comparison at the shapes its results files were measured at (one agent, one core a
# side), whatever configs/smollm2_grpo.yaml has become since (a two-agent team on harder problems)
SMOLLM2_SHAPES = [
    "team.agents=[{name: a0, path: 'builtin:smollm2-135m'}]",
    "grpo.group_size=8",
    "trainer.batch_size=4",
    "data.synthetic.difficulty=1",
    "rollout.dynamic_sampling.enabled=false",
    "rollout.max_staleness=0",
    "trainer.micro_batch_size=8",  # one group, packed
    "trainer.logit_chunk_tokens=1024",
    "trainer.mini_batch_size=null",  # one optimiser step over the batch, as TRL
    "trainer.resources.num_cpus=1",
]
ROOT = Path(__file__).parent.parent
RESULTS = Path(__file__).parent / "results"
SIDES = ("satseq", "trl")
PER_STEP = "per step, s (median, 2..N)"
PHASES = ("rollout", "update", "weight sync")
LORA_RANK = 16
RAY_WORKER_NICENESS = 15  # what Ray's raylet gives its worker processes


def run_config(args, output_dir: str) -> RunConfig:
    """The satseq run: GRPO, one agent, the model's config, no validation; the command line's
    shapes where it gives them."""
    path = CONFIGS[args.model]
    overrides = [
        "algorithm.name=grpo",
        f"trainer.stages={args.steps}",
        f"trainer.save_every={args.steps}",  # HF directories after the last stage only
        "trainer.ppo_epochs=1",  # and no mini-batches: one optimiser step over the batch
        "output.trackers=[]",
        f"output.dir={output_dir}",
    ]
    if path is not None:
        overrides += SMOLLM2_SHAPES
    else:  # the quickstart: one tiny agent, its rollout actors sharing one core
        overrides += [
            f"team.agents=[{{name: policy, path: '{args.model}'}}]",
            f"trainer.micro_batch_size={args.prompts * args.group_size}",  # the whole batch
            "trainer.resources.num_cpus=1",
            f"rollout.num_actors={args.rollout_actors}",
            f"rollout.resources.num_cpus={1 / args.rollout_actors}",
            "data.val_files=[]",
        ]
    shapes = {
        "trainer.batch_size": args.prompts,
        "grpo.group_size": args.group_size,
        "rollout.max_new_tokens": args.max_new_tokens,
        "trainer.lr": args.lr,
    }
    overrides += [f"{key}={value}" for key, value in shapes.items() if value is not None]
    if args.lora:
        overrides.append(f"trainer.lora={{rank: {LORA_RANK}}}")
    return load_config(path and str(ROOT / path), overrides)


def step_seconds(ends: list[float], started: float) -> list[float]:
    """Each step's seconds, from the previous step's end (the first: from `started`)."""
    return [end - start for start, end in zip([started, *ends[:-1]], ends, strict=True)]


def run_satseq(args, out: Path) -> dict:
    import ray

    from satseq.cluster.coordinator_actor import CoordinatorActor
    from satseq.launch.connection import connect

    config = run_config(args, str(out))
    started = time.perf_counter()
    connect(None)
    coordinator = CoordinatorActor.remote(config, str(out / "run"), False)
    ray.get(coordinator.next_stage.remote())  # the team is up
    team_started = time.perf_counter()
    ends, rewards, phases, lengths = [], [], [], []
    for _ in range(args.steps):
        metrics = ray.get(coordinator.run_stage.remote())
        ends.append(time.perf_counter())
        rewards.append(metrics["reward/mean"])
        lengths.append(metrics["response_length/mean"])
        sync = metrics.get("time/weight_sync", 0.0)  # time/update includes the push
        phases.append(
            {
                "rollout": metrics["time/rollout"],
                "update": metrics["time/update"] - sync,
                "weight sync": sync,
            }
        )
    ray.get(coordinator.close.remote())
    return {
        "steps": step_seconds(ends, team_started),
        "phases": phases,
        "wall": ends[-1] - started,
        "startup": team_started - started,
        "rewards": rewards,
        "response_lengths": lengths,
    }


def drawn_problems(config: RunConfig, steps: int) -> list:
    """The problems satseq's first `steps` stages draw, in its order (B a stage)."""
    from satseq.cluster.training_data import training_problems
    from satseq.data.cursor import PromptCursor

    problems = training_problems(config)
    cursor = PromptCursor(len(problems), config.trainer.seed)
    return [problems[i] for _ in range(steps) for i in cursor.next(config.trainer.batch_size)]


def training_prompts(args, config: RunConfig, tokenizer) -> list[dict]:
    """The problems satseq's stages draw, in its order, as TRL dataset rows: the prompt text
    (satseq's chat template), the problem and its answer (for the reward)."""
    from satseq.data import build_prompt
    from satseq.launch.settings import prompt_format

    fmt = prompt_format(config)
    return [
        {"prompt": build_prompt(tokenizer, p, fmt), "problem": p.problem, "answer": p.answer}
        for p in drawn_problems(config, args.steps)
    ]


def run_trl(args, out: Path) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from satseq.launch.settings import reward_scorer
    from satseq.models import load_tokenizer, resolve_model_path

    # Ray runs satseq's actors at nice 15 (its worker niceness): TRL at the same priority, so
    # that other jobs on the machine slow both sides alike
    os.nice(max(0, RAY_WORKER_NICENESS - os.nice(0)))
    config = run_config(args, str(out))
    model_dir = str(resolve_model_path(config.team.agents[0].path))
    scorer = reward_scorer(config)
    rewards: list[float] = []
    rollouts: list[float] = []

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

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer, its rollout phase timed (generation, scoring, log-prob passes)."""

        def _generate_and_score_completions(self, *args, **kwargs):
            started = time.perf_counter()
            batch = super()._generate_and_score_completions(*args, **kwargs)
            rollouts.append(time.perf_counter() - started)
            return batch

    started = time.perf_counter()
    dataset = Dataset.from_list(training_prompts(args, config, load_tokenizer(model_dir)))
    B, G = config.trainer.batch_size, config.grpo.group_size
    clock = StepClock()
    trainer = TimedGRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        train_dataset=dataset,
        callbacks=[clock],
        peft_config=trl_lora() if args.lora else None,
        args=GRPOConfig(
            output_dir=str(out / "trl"),
            per_device_train_batch_size=B * G,
            num_generations=G,
            max_completion_length=config.rollout.max_new_tokens,
            shuffle_dataset=False,  # the rows are already in satseq's order
            learning_rate=config.trainer.lr,
            lr_scheduler_type="constant",
            max_steps=args.steps,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            beta=0.0,
            epsilon=config.grpo.eps_low,
            loss_type="dapo",  # token mean over the batch, as satseq's GRPO
            max_grad_norm=config.trainer.grad_clip,
            gradient_checkpointing=config.trainer.checkpoint_every is not None,
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
    steps = step_seconds(clock.ends, clock.started)
    return {
        "steps": steps,
        "phases": [
            {"rollout": rollout, "update": step - rollout}
            for step, rollout in zip(steps, rollouts, strict=True)
        ],
        "wall": clock.ends[-1] - started,
        "startup": clock.started - started,
        "rewards": rewards,
    }


def trl_lora():
    """satseq's LoRA agent for peft: rank 16, alpha 2·rank, every linear layer but the head."""
    from peft import LoraConfig

    return LoraConfig(
        r=LORA_RANK, lora_alpha=2 * LORA_RANK, lora_dropout=0.0, target_modules="all-linear"
    )


def run_learner(args, out: Path) -> dict:
    """The learner alone: its GRPO update against the bare loop on one batch, alternating, and
    the update over padded rows, each prompt computed in its own row (packing off: the learner
    before it), each step's wall and CPU seconds."""
    import torch
    from learner_workload import bare_step, random_trajectories

    from satseq.actors import packing
    from satseq.actors.learner import Learner
    from satseq.cluster.learner_specs import learner_spec
    from satseq.cluster.recipes.grpo import GrpoRecipe
    from satseq.data import prompt_ids
    from satseq.launch.settings import prompt_format

    config = run_config(args, str(out))
    threads = args.learner_threads or os.cpu_count()
    spec = learner_spec(config, 0, GrpoRecipe.learner_settings(config), "cpu", threads)
    learner = Learner(spec)
    tokenizer = learner.policy.tokenizer
    B, G = config.trainer.batch_size, config.grpo.group_size
    fmt = prompt_format(config)
    prompts = [prompt_ids(tokenizer, p, fmt) for p in drawn_problems(config, 1)]
    trajectories = random_trajectories(
        B * G, 0, args.response_len, len(tokenizer), G, prompts=prompts
    )
    A, c = torch.linspace(-1, 1, B * G), torch.ones(B * G)
    packable = packing.packable

    def update(packed: bool):
        packing.packable = packable if packed else lambda config: False
        learner.update(trajectories, None, A, c)

    steps = {
        "bare": lambda: bare_step(learner.policy, trajectories),
        "update": lambda: update(True),
        "update, padded rows": lambda: update(False),
    }
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for round_ in range(args.learner_rounds + 1):  # round 0 warms up
        for name, step in steps.items():
            started, cpu = time.perf_counter(), time.process_time()
            step()
            if round_:
                seconds[name].append((time.perf_counter() - started, time.process_time() - cpu))
    return {
        "seconds": seconds,
        "tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories),
        "response_tokens": B * G * args.response_len,
        "prompt_len": median(len(p) for p in prompts),
        "settings": (
            f"micro-batches of {spec.micro_batch_size}, gradient checkpointing "
            f"{'on' if spec.checkpoint_every else 'off'}, logit chunks of "
            f"{spec.logit_chunk_tokens} tokens, {threads} thread(s)"
        ),
    }


def summary(runs: list[dict], steps: int) -> dict[str, float]:
    """One side's runs: the median step over steps 2..N of every run (the steady state) and of
    each of its phases, the median first step, start-up and wall, and the mean reward."""
    rewards = [reward for run in runs for reward in run["rewards"]]
    rows = {PER_STEP: median([s for run in runs for s in run["steps"][1:]])}
    for phase in PHASES:
        values = [p[phase] for run in runs for p in run["phases"][1:] if phase in p]
        if values:
            rows[f"  {phase}, s"] = median(values)
    return rows | {
        "first step, s": median([run["steps"][0] for run in runs]),
        "start-up, s": median([run["startup"] for run in runs]),
        f"wall for {steps} steps, s": median([run["wall"] for run in runs]),
        "mean reward": sum(rewards) / len(rewards),
    }


def report(args, config: RunConfig, runs: dict[str, list[dict]], load) -> list[str]:
    sides = {side: summary(runs[side], args.steps) for side in SIDES}
    ratio = sides["satseq"][PER_STEP] / sides["trl"][PER_STEP]
    lengths = [n for run in runs["satseq"] for n in run["response_lengths"]]
    t, r = config.trainer, config.rollout
    return [
        f"GRPO on {args.model}{' (LoRA rank 16, both sides)' if args.lora else ''}: "
        f"{t.batch_size} prompts × G {config.grpo.group_size}, up to {r.max_new_tokens} new "
        f"tokens at T {r.temperature}, lr {t.lr}, gradient checkpointing "
        f"{'on' if t.checkpoint_every else 'off'}, {args.steps} steps; {args.repeats} runs "
        f"a side, alternating, on {os.cpu_count()} cores (load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after); satseq: {r.engine} engine, {r.num_actors} rollout actor(s); "
        f"satseq's mean response {sum(lengths) / len(lengths):.1f} tokens",
        f"{'':28}{'satseq':>9}{'TRL':>9}",
        *(
            f"{label:28}{sides['satseq'].get(label, float('nan')):9.3f}"
            f"{sides['trl'].get(label, float('nan')):9.3f}"
            for label in sides["satseq"]
        ),
        f"per step satseq/TRL: {ratio:.2f} (satseq {1 / ratio:.2f}x TRL's speed)",
    ]


def learner_report(result: dict, load: float) -> list[str]:
    """The learner section: each step's tokens/s by wall and by CPU seconds, against bare."""
    tokens, runs = result["tokens"], result["seconds"]
    wall = {name: median(w for w, _ in values) for name, values in runs.items()}
    cpu = {name: median(c for _, c in values) for name, values in runs.items()}
    lines = [
        f"the learner alone: {tokens} tokens ({result['response_tokens']} response tokens, "
        f"prompts of {result['prompt_len']:.0f}), {result['settings']}; median of "
        f"{len(runs['bare'])} alternating rounds (load average {load:.1f} after)",
        f"{'':30}{'wall s':>8}{'tokens/s':>10}{'÷ bare':>8}{'CPU s':>8}{'tokens/s':>10}"
        f"{'÷ bare':>8}",
    ]
    for name in runs:
        lines.append(
            f"  {name:28}{wall[name]:8.2f}{tokens / wall[name]:10.0f}"
            f"{wall['bare'] / wall[name]:8.2f}{cpu[name]:8.2f}{tokens / cpu[name]:10.0f}"
            f"{cpu['bare'] / cpu[name]:8.2f}"
        )
    return lines


def in_subprocess(side: str, **extra) -> dict:
    """One side's run in a fresh process (this script with --side); its JSON result."""
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in extra.items()]
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, __file__, *sys.argv[1:], *flags, "--side", side, "--out", tmp]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(CONFIGS), default="builtin:tiny-carry-0")
    parser.add_argument("--steps", type=int, help="a run (default: 8; smollm2 4)")
    parser.add_argument("--prompts", type=int, help="B prompts a step (default: the config's)")
    parser.add_argument("--group-size", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--lora", action="store_true", help="rank-16 LoRA agents, both sides")
    parser.add_argument("--repeats", type=int, default=3, help="runs a side")
    parser.add_argument("--rollout-actors", type=int, default=2, help="tiny: on one core")
    parser.add_argument("--learner-rounds", type=int, default=3, help="0: no learner section")
    parser.add_argument("--learner-threads", type=int, help="default: the machine's cores")
    parser.add_argument("--response-len", type=int, help="learner section (default: satseq's)")
    parser.add_argument("--side", choices=(*SIDES, "learner"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tiny = CONFIGS[args.model] is None
    if tiny:  # the quickstart's defaults are not the comparison's
        args.prompts, args.group_size = args.prompts or 4, args.group_size or 8
        args.max_new_tokens, args.lr = args.max_new_tokens or 48, args.lr or 1e-5
    args.steps = args.steps or (8 if tiny else 4)
    if args.lora and lora_missing():
        parser.error(f"--lora: {lora_missing()}")
    if args.side:
        run = {"satseq": run_satseq, "trl": run_trl, "learner": run_learner}[args.side]
        print(json.dumps(run(args, Path(args.out))))
        return

    name = "grpo_trl" + ("" if tiny else "_" + args.model.split(":")[-1])
    name += "_lora" if args.lora else ""
    log = Path(tempfile.gettempdir()) / f"{name}.runs.jsonl"  # each run as it ends
    print(f"each run's numbers go to {log} as it ends", flush=True)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeats):
        for side in SIDES:
            runs[side].append(in_subprocess(side))
            with log.open("a") as lines:
                lines.write(json.dumps({"side": side, **runs[side][-1]}) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        config = run_config(args, tmp)
    lines = report(args, config, runs, (load_before, os.getloadavg()[0])) if args.repeats else []
    if args.learner_rounds:
        lengths = [n for run in runs["satseq"] for n in run["response_lengths"]]
        length = args.response_len or round(sum(lengths) / len(lengths))
        lines += learner_report(in_subprocess("learner", response_len=length), os.getloadavg()[0])
    text = "\n".join(lines)
    print(text)
    results = RESULTS / f"{name}.txt"
    results.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join([".venv/bin/python bench/bench_grpo_trl.py", *sys.argv[1:]])
    results.write_text(f"# {command}\n{text}\n")


if __name__ == "__main__":
    main()
