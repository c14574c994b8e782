"""Learner throughput and memory against a bare training loop on the same tokens ([2.1]).

Each mode runs in its own process (so peak memory is its own): `bare` is a plain
forward + cross-entropy + backward + AdamW loop over full logits, in the same precision as the
learner (float32 masters, autocast compute); the learner modes are `Learner.update` with one
step: `exact` (exact vocabulary KL + trust region), `k3` (k3 KL + trust region) and `plain`
(PPO-clip, no trust region: SPO/GRPO). It prints tokens/s, the ratio to `bare`, MFU on CUDA
(6N FLOPs per token over --peak-tflops) and peak memory (CUDA: allocated; CPU: the process's
max RSS), then the cost of one backtrack (snapshot, restore, and the retried step).
Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_learner.py                      # CPU, a 16M model, vocab 49k
    python bench/bench_learner.py --device cuda --size 0.5b --sequences 16 --prompt-len 256 \
        --response-len 1792 --micro-batch 4
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = {  # Qwen2 shapes; vocabularies as large as real models', where the memory goes
    "small": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
    ),
    "0.5b": dict(  # Qwen2-0.5B
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
}
MODES = ("bare", "exact", "k3", "plain")


def build_model(size: str, directory: Path) -> str:
    """A random-init Qwen2 of `size` with the tiny model's tokenizer (ids are random anyway)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from satseq.models import build_tiny_model

    tiny = build_tiny_model(directory / "tiny", warm_start_steps=1)
    torch.manual_seed(0)
    config = Qwen2Config(**SIZES[size], tie_word_embeddings=True, max_position_embeddings=4096)
    Qwen2ForCausalLM(config).save_pretrained(directory / size)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(directory / size)
    shutil.rmtree(tiny)
    return str(directory / size)


def random_trajectories(args, vocab: int):
    from satseq.actors.trajectory import Trajectory

    g = torch.Generator().manual_seed(0)
    P, R = args.prompt_len, args.response_len
    return [
        Trajectory(
            i,
            torch.randint(5, vocab, (P,), generator=g).tolist(),
            torch.randint(5, vocab, (R,), generator=g).tolist(),
            [1] * R,
            [0] * R,
            "length",
        )
        for i in range(args.sequences)
    ]


def make_learner(args, path: str, mode: str):
    from satseq.actors.learner import (
        Learner,
        LearnerSpec,
        LossSpec,
        OptimizerSpec,
        TrustRegionSpec,
    )

    losses = {
        "exact": LossSpec(),
        "k3": LossSpec(),
        "plain": LossSpec(ratio="token", aggregation="token_mean"),
        "bare": LossSpec(),
    }
    return Learner(
        LearnerSpec(
            model_path=path,
            agent_index=0,
            loss=losses[mode],
            # a target no step reaches: each update is one accepted step, timed alike
            trust_region=TrustRegionSpec(
                enabled=mode in ("exact", "k3"),
                target_kl=1e9,
                kl_estimator="exact" if mode in ("exact", "bare") else "k3",
            ),
            optimizer=OptimizerSpec(lr=1e-6),
            dtype=args.dtype,
            device=args.device,
            micro_batch_size=args.micro_batch,
            num_threads=torch.get_num_threads(),
        )
    )


def bare_step(learner, trajectories) -> None:
    """Forward over full logits [n, L, V], cross-entropy on the response, backward, AdamW."""
    learner.optimizer.zero_grad(set_to_none=True)
    for _, batch in learner._micro_batches(trajectories):
        with learner.autocast():
            logits = learner.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask
            ).logits
        targets = batch.input_ids[:, 1:].masked_fill(batch.attention_mask[:, 1:] == 0, -100)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), targets.flatten(), ignore_index=-100
        )
        (loss * len(batch.input_ids) / len(trajectories)).backward()
    torch.nn.utils.clip_grad_norm_(learner.model.parameters(), 1.0)
    learner.optimizer.step()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def worker(args, path: str, mode: str) -> dict:
    """One mode in this process: seconds per step, peak memory, and the backtrack costs."""
    learner = make_learner(args, path, mode)
    trajectories = random_trajectories(args, learner.model.config.vocab_size)
    A = torch.linspace(-1, 1, len(trajectories))
    c = torch.ones(len(trajectories))
    logp_cur = learner.logprobs(trajectories)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    def step():
        if mode == "bare":
            bare_step(learner, trajectories)
        else:
            learner.update(trajectories, logp_cur, A, c)

    step()  # warm-up
    synchronize(args.device)
    started = time.perf_counter()
    for _ in range(args.repeats):
        step()
    synchronize(args.device)
    seconds = (time.perf_counter() - started) / args.repeats
    if args.device.startswith("cuda"):
        peak_gib = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB → GiB
    result = {"mode": mode, "seconds": seconds, "peak_gib": peak_gib}
    if mode == "exact":  # a backtrack = restore the snapshot, then retry the step
        from satseq.algo.trust_region import restore_training_state, snapshot_training_state

        started = time.perf_counter()
        snapshot = snapshot_training_state(learner.model, learner.optimizer, learner.snapshot)
        synchronize(args.device)
        result["snapshot_s"] = time.perf_counter() - started
        started = time.perf_counter()
        restore_training_state(learner.model, learner.optimizer, snapshot)
        synchronize(args.device)
        result["restore_s"] = time.perf_counter() - started
        result["snapshot_gib"] = snapshot.nbytes / 2**30
    result["parameters"] = sum(p.numel() for p in learner.model.parameters())
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="compute dtype (default: bf16 on cuda)")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=192)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H100 dense bf16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.worker:
        print(json.dumps(worker(args, args.model, args.worker)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.size, Path(tmp))
        results = {}
        for mode in args.modes.split(","):
            command = [sys.executable, __file__, *sys.argv[1:], "--worker", mode, "--model", path]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[mode] = json.loads(out.strip().splitlines()[-1])
    tokens = args.sequences * (args.prompt_len + args.response_len)
    N = results[next(iter(results))]["parameters"]
    bare = results.get("bare")
    print(
        f"model {args.size} ({N / 1e6:.1f}M parameters), {args.device}, compute {args.dtype}, "
        f"{args.sequences} × ({args.prompt_len} + {args.response_len}) tokens, "
        f"micro-batch {args.micro_batch}"
    )
    print(f"{'mode':8} {'tokens/s':>10} {'÷ bare':>7} {'MFU':>6} {'peak GiB':>9} {'÷ bare':>7}")
    for mode, r in results.items():
        rate = tokens / r["seconds"]
        mfu = 6 * N * rate / (args.peak_tflops * 1e12) if args.device.startswith("cuda") else None
        print(
            f"{mode:8} {rate:10.0f} "
            f"{bare['seconds'] / r['seconds'] if bare else float('nan'):7.2f} "
            f"{f'{100 * mfu:5.1f}%' if mfu is not None else '    -'} "
            f"{r['peak_gib']:9.2f} "
            f"{r['peak_gib'] / bare['peak_gib'] if bare else float('nan'):7.2f}"
        )
    if "exact" in results:
        r = results["exact"]
        print(
            f"one backtrack: restore {r['restore_s']:.3f} s + the retried step "
            f"{r['seconds']:.3f} s; the snapshot before every step {r['snapshot_s']:.3f} s "
            f"({r['snapshot_gib']:.2f} GiB, off the accelerator)"
        )


if __name__ == "__main__":
    main()
