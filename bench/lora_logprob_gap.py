"""Engine against learner log-probs of a trained LoRA team: each agent's saved adapter of one
stage of a run, sampled by the team's one engine at the run's temperature, then scored by a
learner loaded from the same adapter directory. A gap near 0 says that what the engine samples
is what the learner trains on (the adapter reached the engine unchanged); the `hf` engine is
the reference measured in the same run.

    python bench/lora_logprob_gap.py OUTPUT_DIR --stage 7                  # vllm and hf
    python bench/lora_logprob_gap.py OUTPUT_DIR --stage 7 --engines vllm --prompts 16
"""

from __future__ import annotations

import argparse
from pathlib import Path

from satseq.actors.engines.lora import team_engines
from satseq.actors.learner import Learner, LearnerSpec
from satseq.actors.trajectory import SamplingSpec, Trajectory
from satseq.config import TRAIN_CONFIG, load_config
from satseq.data import make_split
from satseq.data.prompts import prompt_ids
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
    config = load_config(str(args.run / TRAIN_CONFIG), [])
    agents = [agent.name for agent in config.team.agents]
    adapters = {name: str(args.run / f"agent_{name}" / f"stage_{args.stage}") for name in agents}
    tokenizer = load_tokenizer(adapters[agents[0]])
    problems = make_split("test", args.prompts, difficulty=1, style="words")
    prompts = [prompt_ids(tokenizer, problem, prompt_format(config)) for problem in problems]
    spec = SamplingSpec(
        temperature=config.rollout.temperature,
        max_new_tokens=args.max_new_tokens,
        behaviour_logprobs=True,
    )
    print(f"{args.run} stage {args.stage}: {len(prompts)} prompts at T {spec.temperature}")
    print("| engine | agent | tokens | max gap | mean gap |")
    print("|---|---|---|---|---|")
    for kind in args.engines:
        seeds = {name: k for k, name in enumerate(agents)}
        team = team_engines(kind, adapters, seeds, ENGINE_OPTIONS[kind])
        try:
            for k, name in enumerate(agents):
                gaps = logprob_gaps(team[name], adapters[name], k, prompts, spec)
                print(
                    f"| {kind} | {name} | {len(gaps)} | {max(gaps):.2e} | "
                    f"{sum(gaps) / len(gaps):.2e} |"
                )
        finally:
            for engine in team.values():
                engine.close()


def logprob_gaps(engine, adapter: str, agent_index: int, prompts, spec) -> list[float]:
    """|engine log-prob − learner log-prob| of every token the engine sampled."""
    samples = [n_samples[0] for n_samples in engine.generate(prompts, spec)]
    trajectories = [
        Trajectory(
            i,
            prompts[i],
            sample.token_ids,
            [1] * len(sample.token_ids),
            [agent_index] * len(sample.token_ids),
            sample.finish_reason,
        )
        for i, sample in enumerate(samples)
    ]
    learner = Learner(
        LearnerSpec(model_path=adapter, agent_index=agent_index, temperature=spec.temperature)
    )
    learned = learner.logprobs(trajectories)
    return [
        abs(engine_logprob - learner_logprob)
        for row, sample in enumerate(samples)
        for engine_logprob, learner_logprob in zip(
            sample.token_logprobs, learned[row, : len(sample.token_ids)].tolist(), strict=True
        )
    ]


if __name__ == "__main__":  # vLLM's engine processes re-import this file
    main()
