"""Learner update throughput: through the Ray actor ÷ the same update bare in one process.

Both sides run the same `Learner.update` (trust region on, exact KL) on the same random
trajectories, one thread each; the ratio is what the actor boundary (serialisation of the
batch and the result, scheduling) costs. Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_learner.py [--size quickstart|50m] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import ray
import torch

from satseq.actors.learner import Learner, LearnerActor, LearnerSpec
from satseq.actors.trajectory import Trajectory
from satseq.models import build_tiny_model


def random_trajectories(
    vocab: int, n: int, prompt_len: int, response_len: int, seed: int
) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(5, vocab, (prompt_len,), generator=g).tolist()
        response = torch.randint(5, vocab, (response_len,), generator=g).tolist()
        out.append(
            Trajectory(i, prompt, response, [1] * response_len, [0] * response_len, "length")
        )
    return out


def timed_updates(update, logprobs, trajectories, repeats: int) -> float:
    """Seconds per update, after one warm-up update."""
    A = torch.linspace(-1, 1, len(trajectories))
    c = torch.ones(len(trajectories))
    logp_cur = logprobs(trajectories)
    update(trajectories, logp_cur, A, c)
    started = time.perf_counter()
    for _ in range(repeats):
        update(trajectories, logp_cur, A, c)
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="quickstart")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=48)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(
            build_tiny_model(
                f"{tmp}/m",
                size=args.size,
                warm_start_steps=1 if args.size == "quickstart" else None,
            )
        )
        spec = LearnerSpec(
            model_path=path, agent_index=0, lr=1e-5, target_kl=10.0, micro_batch_size=8
        )
        bare = Learner(spec)
        trajectories = random_trajectories(
            len(bare.tokenizer), args.trajectories, 32, args.response_len, 0
        )
        tokens = args.trajectories * args.response_len
        bare_s = timed_updates(bare.update, bare.logprobs, trajectories, args.repeats)

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        actor = LearnerActor.options(num_cpus=1).remote(spec)
        actor_s = timed_updates(
            lambda *a: ray.get(actor.update.remote(*a)),
            lambda t: ray.get(actor.logprobs.remote(t)),
            trajectories,
            args.repeats,
        )
        sync_started = time.perf_counter()
        ray.get(actor.weights.remote())
        sync_s = time.perf_counter() - sync_started
        ray.shutdown()
    params = sum(p.numel() for p in bare.model.parameters())
    print(
        f"model: {args.size} ({params / 1e6:.2f}M parameters),"
        f" {args.trajectories} × {args.response_len} response tokens"
    )
    print(f"bare update:  {tokens / bare_s:10.0f} tokens/s ({bare_s:.3f} s)")
    print(f"actor update: {tokens / actor_s:10.0f} tokens/s ({actor_s:.3f} s)")
    print(f"actor ÷ bare: {bare_s / actor_s:.3f}")
    print(f"weights out of the actor: {sync_s:.3f} s")


if __name__ == "__main__":
    main()
