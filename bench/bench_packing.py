"""Padding-free micro-batches against padded ones ([4.1] item 3): the learner's GRPO update
(`plain`) and the bare loop, each with the trajectories packed (`satseq.actors.packing`) and
over padded rows (packing off), on responses of rollout-like lengths
(`learner_workload.rollout_lengths`: half the padded response positions are padding).

One process; `--rounds` rounds each time one step of every variant in turn (after a warm-up
round), so the machine's drift slows a round's variants alike. It prints each layout's share
of padding, each variant's median tokens/s and the median over rounds of packed ÷ padded (with
the lowest and highest round's). Not a timed test: it prints numbers.

    .venv/bin/python bench/bench_packing.py                                # CPU, SmolLM2's shapes
    .venv/bin/python bench/bench_packing.py --size tiny --rounds 1         # seconds
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from learner_workload import SIZES, build_model, learner_spec, random_trajectories, time_mode

from satseq.actors import packing
from satseq.actors.learner import Learner, OptimizerSpec
from satseq.actors.learner.micro_batches import agent_micro_batches, padding_fraction


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="smollm2")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    packable = packing.packable

    def layout(packed: bool) -> None:
        packing.packable = packable if packed else lambda config: False

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.size, Path(tmp))
        learner = Learner(
            learner_spec(
                "plain",
                path,
                optimizer=OptimizerSpec(lr=1e-6),
                micro_batch_size=args.micro_batch,
                num_threads=torch.get_num_threads(),
            )
        )
        vocab = learner.policy.model.config.vocab_size
        trajectories = random_trajectories(
            args.sequences, args.prompt_len, args.response_len, vocab, varied=True
        )
        tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
        shares = {}
        for packed in (True, False):
            layout(packed)
            shares[packed] = padding_fraction(agent_micro_batches(learner.policy, trajectories)[0])
        variants = [(mode, packed) for mode in ("plain", "bare") for packed in (True, False)]
        seconds = {variant: [] for variant in variants}
        for round_ in range(args.rounds + 1):
            for mode, packed in variants:
                layout(packed)
                row = time_mode(learner, mode, trajectories, 1, "cpu", warm_up=False)
                if round_:
                    seconds[mode, packed].append(row["seconds"])
        layout(True)
    print(
        f"model {args.size}, {args.sequences} sequences × ({args.prompt_len} prompt + up to "
        f"{args.response_len} response) tokens = {tokens} a step, micro-batch "
        f"{args.micro_batch}, {torch.get_num_threads()} thread(s), {args.rounds} paired rounds"
    )
    print(f"padding: padded rows {shares[False]:.3f}, packed {shares[True]:.3f}")
    print(f"{'mode':6} {'layout':7} {'tokens/s':>9} {'packed ÷ padded':>16} {'rounds':>11}")
    for mode, packed in variants:
        times = seconds[mode, packed]
        ratios = sorted(
            p / q for p, q in zip(seconds[mode, False], seconds[mode, True], strict=True)
        )
        ratio = f"{statistics.median(ratios):16.2f} {f'{ratios[0]:.2f}–{ratios[-1]:.2f}':>11}"
        print(
            f"{mode:6} {'packed' if packed else 'padded':7} "
            f"{tokens / statistics.median(times):9.0f} {ratio if packed else ''}"
        )


if __name__ == "__main__":
    main()
