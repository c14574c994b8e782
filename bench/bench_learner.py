"""Learner throughput and memory against a bare training loop on the same tokens ([2.1]).

Each mode runs in its own process (so peak memory is its own): `bare` is a good training loop
on the learner's own kernels (`learner_workload.bare_step`: packed without padding, the fused
output layer over the response tokens, cross-entropy, backward, AdamW, each weight cast once a
step, in the learner's precision), `bare+check` the same plus the one forward pass k3's
trust-region check adds (the response log-probs), `bare+kl-check` with exact's check pass
instead (those and the exact vocabulary KL against π_cur); the learner modes are
`Learner.update` with one
step: `exact` (exact vocabulary KL + trust region), `k3` (k3 KL + trust region) and `plain`
(PPO-clip as GRPO takes it: no trust region, no pass after the step, the behaviour log-probs
from the step's own forward). It prints tokens/s, the ratio to the mode's baseline
(`learner_workload.BASELINE`: `bare+kl-check` for exact, `bare+check` for k3, `bare` for
plain), MFU on CUDA
(6N FLOPs per token over --peak-tflops) and peak memory (CUDA: allocated; CPU: the process's
max RSS), then the cost of one backtrack (snapshot, restore, and the retried step). The workload is
`learner_workload`'s, as `gpu_sheet.py`'s, which measures all of this on a GPU in one command.
Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_learner.py                      # CPU, a 16M model, vocab 49k
    .venv/bin/python bench/bench_learner.py --size smollm2 --sequences 4 --paired 6
    python bench/bench_learner.py --device cuda --size 0.5b --sequences 16 --prompt-len 256 \
        --response-len 1792 --micro-batch 4
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from learner_workload import (
    BARE_MODES,
    BASELINE,
    SIZES,
    backtrack_costs,
    build_model,
    learner_spec,
    random_trajectories,
    time_mode,
    workload_tokens,
)

MODES = (*BARE_MODES, "exact", "k3", "plain")


def make_learner(args, path: str, mode: str):
    from satseq.actors.learner import Learner, OptimizerSpec

    return Learner(
        learner_spec(
            "plain" if mode in BARE_MODES else mode,
            path,
            optimizer=OptimizerSpec(lr=1e-6),
            dtype=args.dtype,
            device=args.device,
            micro_batch_size=args.micro_batch,
            num_threads=torch.get_num_threads(),
        )
    )


def workload(args, vocab: int) -> list:
    return random_trajectories(
        args.sequences, args.prompt_len, args.response_len, vocab, varied=args.varied
    )


def worker(args, path: str, mode: str) -> dict:
    """One mode in this process: seconds per step, peak memory, and the backtrack costs."""
    learner = make_learner(args, path, mode)
    vocab = learner.policy.model.config.vocab_size
    trajectories = workload(args, vocab)
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


def paired(args, path: str, modes: list[str]) -> dict[str, tuple[list[float], list[float]]]:
    """Each learner mode against its baseline (`BASELINE`: the bare loop, with its check pass
    where the mode checks), in this process holding just the two learners: after a warm-up
    round, `--paired` rounds each timing one step of both, the one that went first going
    second the next round, so that the machine's drift slows both alike and neither always
    inherits the other's freed memory and caches. Seconds per step of the mode and of its
    baseline, round by round."""
    from satseq.actors.residency import return_free_host_memory

    bare = make_learner(args, path, "bare")
    trajectories = workload(args, bare.policy.model.config.vocab_size)
    seconds = {}
    for mode in (mode for mode in modes if mode not in BARE_MODES):
        pair = {mode: make_learner(args, path, mode), BASELINE[mode]: bare}
        times: dict[str, list[float]] = {name: [] for name in pair}
        for round_ in range(args.paired + 1):
            for name in list(pair)[:: 1 if round_ % 2 else -1]:
                row = time_mode(pair[name], name, trajectories, 1, args.device, warm_up=False)
                if round_:
                    times[name].append(row["seconds"])
        seconds[mode] = (times[mode], times[BASELINE[mode]])
        del pair  # the mode's learner freed before the next one is built
        gc.collect()
        return_free_host_memory()
    return seconds


def print_paired(args, seconds: dict[str, tuple[list[float], list[float]]]) -> None:
    """Each mode's and its baseline's median tokens/s, and the median over rounds of their
    ratio (with the lowest and highest round's)."""
    tokens = workload_tokens(args.sequences, args.prompt_len, args.response_len, args.varied)
    print(f"{args.paired} paired rounds a mode, one step of it and of its baseline a round")
    print(f"{'mode':8} {'tokens/s':>9} {'base':>14} {'tokens/s':>9} {'÷ base':>7} {'rounds':>11}")
    for mode, (times, base_times) in seconds.items():
        ratios = sorted(b / t for b, t in zip(base_times, times, strict=True))
        print(
            f"{mode:8} {tokens / statistics.median(times):9.0f} {BASELINE[mode]:>14} "
            f"{tokens / statistics.median(base_times):9.0f} {statistics.median(ratios):7.2f} "
            f"{f'{ratios[0]:.2f}–{ratios[-1]:.2f}':>11}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="compute dtype (default: bf16 on cuda)")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=192)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument(
        "--varied", action="store_true", help="responses of rollout-like lengths up to the length"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H100 dense bf16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--paired",
        type=int,
        default=0,
        help="N: each learner mode against its baseline, the two in one process, N rounds of "
        "one step each in turn (ratios per round; no peak memory)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.worker:
        print(json.dumps(worker(args, args.model, args.worker)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.size, Path(tmp), args.device)
        if args.paired:
            print_paired(args, paired(args, path, args.modes.split(",")))
            return
        results = {}
        for mode in args.modes.split(","):
            command = [sys.executable, __file__, *sys.argv[1:], "--worker", mode, "--model", path]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[mode] = json.loads(out.strip().splitlines()[-1])
    tokens = workload_tokens(args.sequences, args.prompt_len, args.response_len, args.varied)
    N = results[next(iter(results))]["parameters"]
    bare = results.get("bare")
    print(
        f"model {args.size} ({N / 1e6:.1f}M parameters), {args.device}, compute {args.dtype}, "
        f"{args.sequences} × ({args.prompt_len} + {args.response_len}) tokens, "
        f"micro-batch {args.micro_batch}"
    )
    print(
        f"{'mode':10} {'tokens/s':>10} {'÷ base':>7} {'base':>10} {'MFU':>6} {'peak GiB':>9} "
        f"{'÷ bare':>7}"
    )
    for mode, r in results.items():
        rate = tokens / r["seconds"]
        mfu = 6 * N * rate / (args.peak_tflops * 1e12) if args.device.startswith("cuda") else None
        base = results.get(BASELINE[mode])
        print(
            f"{mode:10} {rate:10.0f} "
            f"{base['seconds'] / r['seconds'] if base else float('nan'):7.2f} "
            f"{BASELINE[mode]:>10} "
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
            f"({r['snapshot_gib']:.2f} GiB, off the accelerator), "
            f"{r['snapshot_exposed_s']:.3f} s until `save` returns"
        )


if __name__ == "__main__":
    main()
