"""Rollout throughput: the hf and vllm engines against each other, and the Ray actor against
the engine it wraps, with weight-sync times, all measured in the same run.

    python bench/bench_rollout.py [--prompts 16] [--samples 4] [--max-new-tokens 64]
                                  [--threads 1] [--repeats 3] [--skip-50m]

Models: the quickstart tiny model (`builtin:tiny`, 0.16M parameters) and a random-init ~50M
Qwen2 (`satseq.models` size "50m"), both with the tiny model's tokenizer. The workload is a
rollout step: `--prompts` quickstart prompts, `--samples` samples each, temperature 1.

Per model, for each engine called in this process and (tiny model only) through a
`RolloutActor` holding the same engine:
- generated tokens/s, and the ratios hf ÷ vllm and actor ÷ bare;
- seconds per weight sync, `load_weights` of a learner's state_dict (through the actor, the
  state_dict's trip through Ray included).

Every variant runs once to warm up, then the variants take turns `--repeats` times and each
reports its fastest run: the machine is shared, and taking turns exposes all of them to the
same background load. Every engine gets `--threads` torch threads, as rollout actors do.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import ray
import torch

from satseq.actors.engines import ENGINE_KINDS, make_engine
from satseq.actors.rollout import RolloutActor
from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.data import make_split, prompt_ids
from satseq.models import build_tiny_model, load_policy, load_tokenizer, resolve_model_path

Generate = Callable[[], list[list[Generation]]]
Sync = Callable[[], object]


def quickstart_prompts(model_path: str, count: int) -> list[list[int]]:
    tokenizer = load_tokenizer(model_path)
    problems = make_split("test", count, difficulty=1, style="symbols")
    return [prompt_ids(tokenizer, problem) for problem in problems]


def learner_weights(model_path: str) -> dict[str, torch.Tensor]:
    """A learner's state_dict after a step: the model's weights plus seeded noise."""
    model, _ = load_policy(model_path, "float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=generator))
    return model.state_dict()


def fastest_in_turns(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Seconds of each run's fastest call; runs take turns after one warm-up call each."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def tokens_per_second(runs: dict[str, Generate], repeats: int) -> dict[str, float]:
    """Generated tokens per second of each run (the token count of its last call)."""
    tokens = {}

    def counting(name: str, run: Generate) -> Callable[[], None]:
        def call() -> None:
            tokens[name] = sum(len(g.token_ids) for samples in run() for g in samples)

        return call

    seconds = fastest_in_turns({name: counting(name, run) for name, run in runs.items()}, repeats)
    return {name: tokens[name] / seconds[name] for name in runs}


def bench_model(
    name: str, path: str, args: argparse.Namespace, spec: SamplingSpec, with_actors: bool
) -> None:
    prompts = quickstart_prompts(path, args.prompts)
    weights = learner_weights(path)
    requests = [("agent", prompt, args.samples) for prompt in prompts]
    options = {"num_threads": args.threads}
    generate: dict[str, Generate] = {}
    sync: dict[str, Sync] = {}
    start_seconds = {}
    cleanups = []
    for kind in ENGINE_KINDS:
        started = time.perf_counter()
        engine = make_engine(kind, path, **options)
        start_seconds[kind] = time.perf_counter() - started
        cleanups.append(engine.close)
        generate[kind] = lambda engine=engine: engine.generate(prompts, spec, args.samples)
        sync[kind] = lambda engine=engine: engine.load_weights(weights)
        if with_actors:
            actor = RolloutActor.options(name=f"bench-rollout-{kind}").remote(
                {"agent": path}, kind, options, 0
            )
            ray.get(actor.ready.remote())
            cleanups.append(lambda actor=actor: ray.kill(actor))
            generate[f"{kind} actor"] = lambda actor=actor: ray.get(
                actor.generate.remote(requests, spec)
            )
            sync[f"{kind} actor"] = lambda actor=actor: ray.get(
                actor.load_weights.remote("agent", weights)
            )
    try:
        throughput = tokens_per_second(generate, args.repeats)
        sync_seconds = fastest_in_turns(sync, args.repeats)
    finally:
        for cleanup in cleanups:
            cleanup()

    print(f"\n{name}")
    print(f"{'engine':<12}{'start s':>9}{'tokens/s':>11}{'sync s':>9}")
    for variant in generate:
        start = f"{start_seconds[variant]:.1f}" if variant in start_seconds else "-"
        print(f"{variant:<12}{start:>9}{throughput[variant]:>11.0f}{sync_seconds[variant]:>9.3f}")
    print(f"hf ÷ vllm tokens/s: {throughput['hf'] / throughput['vllm']:.2f}")
    if with_actors:
        for kind in ENGINE_KINDS:
            ratio = throughput[f"{kind} actor"] / throughput[kind]
            print(f"{kind} actor ÷ bare tokens/s: {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-50m", action="store_true")
    args = parser.parse_args()
    # Unseeded, as in training: vLLM samples seeded requests with per-request generators.
    spec = SamplingSpec(temperature=1.0, max_new_tokens=args.max_new_tokens)
    print(
        f"{args.prompts} prompts x {args.samples} samples, up to {args.max_new_tokens} new "
        f"tokens, {args.threads} thread(s) per engine, fastest of {args.repeats} turns"
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        bench_model("tiny (0.16M)", str(resolve_model_path("builtin:tiny")), args, spec, True)
    finally:
        ray.shutdown()
    if not args.skip_50m:
        with tempfile.TemporaryDirectory() as scratch:
            path = str(build_tiny_model(f"{scratch}/50m", size="50m"))
            bench_model("random 50M", path, args, spec, False)


if __name__ == "__main__":
    main()
