"""Learner throughput and memory against a bare training loop on the same tokens ([2.1]).

Each mode runs in its own process (so peak memory is its own): `bare` is a plain
forward + cross-entropy + backward + AdamW loop over full logits, in the same precision as the
learner (float32 masters, autocast compute); the learner modes are `Learner.update` with one
step: `exact` (exact vocabulary KL + trust region), `k3` (k3 KL + trust region) and `plain`
(PPO-clip as GRPO takes it: no trust region, no pass after the step, the behaviour log-probs
from the step's own forward). It prints tokens/s, the ratio to `bare`, MFU on CUDA (6N FLOPs
per token over --peak-tflops) and peak memory (CUDA: allocated; CPU: the process's max RSS),
then the cost of one backtrack (snapshot, restore, and the retried step). The workload is
`learner_workload`'s, as `gpu_sheet.py`'s, which measures all of this on a GPU in one command.
Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_learner.py                      # CPU, a 16M model, vocab 49k
    python bench/bench_learner.py --device cuda --size 0.5b --sequences 16 --prompt-len 256 \
        --response-len 1792 --micro-batch 4
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from learner_workload import (
    SIZES,
    backtrack_costs,
    build_model,
    learner_spec,
    random_trajectories,
    time_mode,
)

MODES = ("bare", "exact", "k3", "plain")


def make_learner(args, path: str, mode: str):
    from satseq.actors.learner import Learner, OptimizerSpec

    return Learner(
        learner_spec(
            "plain" if mode == "bare" else mode,
            path,
            optimizer=OptimizerSpec(lr=1e-6),
            dtype=args.dtype,
            device=args.device,
            micro_batch_size=args.micro_batch,
            num_threads=torch.get_num_threads(),
        )
    )


def worker(args, path: str, mode: str) -> dict:
    """One mode in this process: seconds per step, peak memory, and the backtrack costs."""
    learner = make_learner(args, path, mode)
    vocab = learner.policy.model.config.vocab_size
    trajectories = random_trajectories(args.sequences, args.prompt_len, args.response_len, vocab)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    result = {"mode": mode, **time_mode(learner, mode, trajectories, args.repeats, args.device)}
    if args.device.startswith("cuda"):
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    else:
        result["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB
    if mode == "exact":
        result |= backtrack_costs(learner.policy, args.device)
    result["parameters"] = sum(p.numel() for p in learner.policy.model.parameters())
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
        path = build_model(args.size, Path(tmp), args.device)
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
    for mode, r in results.items():
        if r.get("backtracks") or r.get("not_applied"):
            print(f"{mode}: {r['backtracks']} backtracks, {r['not_applied']} epochs rejected")
    if "exact" in results:
        r = results["exact"]
        print(
            f"one backtrack: restore {r['restore_s']:.3f} s + the retried step "
            f"{r['seconds']:.3f} s; the snapshot before every step {r['snapshot_s']:.3f} s "
            f"({r['snapshot_gib']:.2f} GiB, off the accelerator)"
        )


if __name__ == "__main__":
    main()
