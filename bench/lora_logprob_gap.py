"""Engine against learner log-probs of a trained LoRA team: each agent's saved adapter of one
stage of a run, sampled as training samples it (a rollout worker with the team's one engine, at
the run's temperature and seed), then scored by a learner loaded from the same adapter
directory. A gap near 0 says that what the engine samples is what the learner trains on (the
adapter reached the engine unchanged); the `hf` engine is the reference measured in the same
run.

    python bench/lora_logprob_gap.py OUTPUT_DIR --stage 7                  # vllm and hf
    python bench/lora_logprob_gap.py OUTPUT_DIR --stage 7 --engines vllm --prompts 16
"""

from __future__ import annotations

import argparse
from pathlib import Path

from satseq.actors.learner import Learner, LearnerSpec
from satseq.actors.rollout import RolloutWorker
from satseq.actors.topology import owner_rollouts
from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.config import TRAIN_CONFIG, load_config
from satseq.data.prompts import prompt_ids
from satseq.evaluation import resolve_dataset
from satseq.launch.settings import prompt_format
from satseq.models import load_tokenizer

# vLLM reports the sampled tokens' log-probs at the temperature only in this mode
ENGINE_OPTIONS = {"vllm": {"logprobs_mode": "processed_logprobs"}, "hf": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a `satseq train` output directory")
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--engines", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"])
    parser.add_argument("--prompts", type=int, default=6, help="held-out problems, 1 sample each")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    # the run's held-out problems, as `satseq eval --dataset synthetic:test` asks them
    config = load_config(str(args.run / TRAIN_CONFIG), [f"eval.synthetic_problems={args.prompts}"])
    agents = [agent.name for agent in config.team.agents]
    adapters = {name: str(args.run / f"agent_{name}" / f"stage_{args.stage}") for name in agents}
    tokenizer = load_tokenizer(adapters[agents[0]])
    problems = resolve_dataset("synthetic:test", config)
    run_prompt_format = prompt_format(config)
    prompts = [prompt_ids(tokenizer, problem, run_prompt_format) for problem in problems]
    spec = SamplingSpec(
        temperature=config.rollout.temperature,
        max_new_tokens=args.max_new_tokens,
        behaviour_logprobs=True,
    )
    learners = [
        Learner(LearnerSpec(model_path=adapters[name], agent_index=k, temperature=spec.temperature))
        for k, name in enumerate(agents)
    ]
    print(f"{args.run} stage {args.stage}: {len(prompts)} prompts at T {spec.temperature}")
    print("| engine | agent | tokens | max gap | mean gap |")
    print("|---|---|---|---|---|")
    every_agent = [list(range(len(agents)))] * len(prompts)  # each prompt once by each agent
    unscored = [None] * len(prompts)
    for kind in args.engines:
        worker = RolloutWorker(adapters, kind, ENGINE_OPTIONS[kind], config.trainer.seed)
        try:
            sampled = owner_rollouts(
                worker.generate, agents, lambda p, a: prompts[p], every_agent, unscored, spec
            )
        finally:
            worker.close()
        for k, (name, learner) in enumerate(zip(agents, learners, strict=True)):
            gaps = logprob_gaps(learner, [t for t in sampled if t.owner_ids[0] == k])
            print(
                f"| {kind} | {name} | {len(gaps)} | {max(gaps):.2e} | {sum(gaps) / len(gaps):.2e} |"
            )


def logprob_gaps(learner: Learner, trajectories: list[Trajectory]) -> list[float]:
    """|engine log-prob − learner log-prob| of every token the engine sampled."""
    learned = learner.logprobs(trajectories)
    return [
        abs(engine_logprob - learner_logprob)
        for row, trajectory in enumerate(trajectories)
        for engine_logprob, learner_logprob in zip(
            trajectory.behaviour_logprobs,
            learned[row, : len(trajectory.response_ids)].tolist(),
            strict=True,
        )
    ]


if __name__ == "__main__":  # vLLM's engine processes re-import this file
    main()
