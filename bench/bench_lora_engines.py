"""A LoRA team's rollout on one shared engine against merged engines of their own
(`rollout.lora_engines`), in one process, measured in the same run.

    .venv/bin/python bench/bench_lora_engines.py [--model builtin:smollm2-135m] [--agents 3]
        [--prompts 8] [--samples 8] [--max-new-tokens 128] [--repeats 3]

The team: `--agents` fresh rank-16 adapters (alpha 32, every linear layer but the output layer,
as `configs/smollm2_lora.yaml`'s) on `--model`, each with its B perturbed so that the agents
differ from the base and from each other. The workload is one stage's generation: `--prompts`
SmolLM2-config prompts (the `levels_1_to_3` word problems and system prompt of
`configs/smollm2.yaml`) answered `--samples` times by every agent at the config's temperature,
through `team_engines` as a rollout worker calls it: the shared engine in one call with each
prompt's adapter, the merged engines one call each. Then one push of an agent's adapter to each
(the merged engine merges it into the base and reloads the model). The variants take turns
`--repeats` times after a warm-up; each reports its fastest run (the machine is shared). vLLM's
CPU build on this machine. Not a timed test: it prints numbers.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from satseq.actors.engines.lora import LoraAgentEngine, team_engines
from satseq.actors.trajectory import SamplingSpec
from satseq.cluster.training_data import training_problems
from satseq.config import load_config
from satseq.data.prompts import prompt_ids
from satseq.launch.settings import prompt_format
from satseq.models import load_tokenizer, resolve_model_path
from satseq.models.adapters import ADAPTER_WEIGHTS, LoraSpec, initial_adapter, write_adapter


def perturbed_adapters(base: str, agents: int, out: Path) -> dict[str, str]:
    """`agents` rank-16 adapters on `base`, B drawn small and seeded per agent (a trained
    adapter's B is not 0)."""
    paths = {}
    for k in range(agents):
        adapter = Path(initial_adapter(base, LoraSpec(16, 32.0), k, out / "fresh"))
        tensors = load_file(str(adapter / ADAPTER_WEIGHTS))
        generator = torch.Generator().manual_seed(k)
        for name, tensor in tensors.items():
            if ".lora_B." in name:
                tensor.copy_(1e-3 * torch.randn(tensor.shape, generator=generator))
        config = json.loads((adapter / "adapter_config.json").read_text())
        paths[f"a{k}"] = str(write_adapter(out / f"a{k}", config, tensors))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config("configs/smollm2.yaml", [])
    base = str(resolve_model_path(args.model))
    tokenizer = load_tokenizer(base)
    fmt = prompt_format(config)
    prompts = [prompt_ids(tokenizer, p, fmt) for p in training_problems(config)[: args.prompts]]
    spec = SamplingSpec(temperature=config.rollout.temperature, max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = perturbed_adapters(base, args.agents, Path(tmp))
        seeds = {name: k for k, name in enumerate(adapters)}
        options = {"num_threads": torch.get_num_threads(), "fp32_head": True}
        teams = {
            "shared": team_engines("vllm", adapters, seeds, options),
            "merged": team_engines("vllm", adapters, seeds, options | {"lora_engines": "merged"}),
        }
        push = load_file(str(Path(adapters["a0"]) / ADAPTER_WEIGHTS))

        def stage(team) -> int:
            """One stage's generation, as a rollout worker calls the engines; its tokens."""
            if isinstance(team["a0"], LoraAgentEngine):  # one call, each prompt's adapter
                engine = team["a0"].shared.engine
                agents = [name for name in team for _ in prompts]
                samples = engine.generate(prompts * len(team), spec, args.samples, adapters=agents)
            else:
                samples = [
                    group for engine in team.values()
                    for group in engine.generate(prompts, spec, args.samples)
                ]  # fmt: skip
            return sum(len(g.token_ids) for group in samples for g in group)

        best = {name: float("inf") for name in teams}
        tokens = {}
        sync = {name: float("inf") for name in teams}
        for round_ in range(args.repeats + 1):
            for name, team in teams.items():
                started = time.perf_counter()
                tokens[name] = stage(team)
                seconds = time.perf_counter() - started
                started = time.perf_counter()
                team["a0"].load_weights(push)
                pushed = time.perf_counter() - started
                if round_:
                    best[name] = min(best[name], seconds)
                    sync[name] = min(sync[name], pushed)
        for team in teams.values():
            for engine in team.values():
                engine.close()
    print(
        f"{args.agents} LoRA agents (rank 16) on {args.model}, vLLM on {torch.get_num_threads()} "
        f"threads: {args.prompts} prompts × {args.samples} samples an agent, up to "
        f"{args.max_new_tokens} new tokens at T {spec.temperature}; fastest of {args.repeats}"
    )
    print(f"{'engines':8} {'stage s':>8} {'tokens':>7} {'tokens/s':>9} {'push s':>7}")
    for name in teams:
        print(
            f"{name:8} {best[name]:8.1f} {tokens[name]:7d} {tokens[name] / best[name]:9.1f} "
            f"{sync[name]:7.2f}"
        )
    speed = {name: tokens[name] / best[name] for name in teams}
    print(f"merged ÷ shared tokens/s: {speed['merged'] / speed['shared']:.2f}")


if __name__ == "__main__":
    main()
