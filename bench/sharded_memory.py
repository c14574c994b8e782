"""Per-GPU memory of one agent's update sharded over W learner ranks (`trainer.workers_per_agent`,
FSDP2), W = 1, 2, 4, 8 (README "Agents bigger than one GPU").

Computed, not measured (the GPU measurement needs a machine with W GPUs): bytes on each rank's
GPU during the update, b = 2 (bf16 compute), P parameters, P_l one decoder layer's:

    sharded state        16 P / W    fp32 master shard 4, gradient shard 4, AdamW moments 8
    autocast copies      b P         bf16 copies of the Linear weights, cached by autocast for
                                     a micro-batch's backward (FSDP2 gathers fp32)
    gathered root        4 P_root    embeddings, final norm and output layer, fp32, gathered
                                     for the whole forward and backward
    gathered layers      12 P_l      the layer being computed and the one prefetched (fp32),
                                     and one layer's unsharded gradient before reduce-scatter
    working set          as bench/colocate_memory.py: π_cur's output layer and hidden states,
                                     one micro-batch's activations, one chunk's logits

Host memory per rank: the backtracking snapshot of its shard (16 P / W, pinned).

    python bench/sharded_memory.py
    python bench/sharded_memory.py --gpu-gb 141
"""

from __future__ import annotations

import argparse

from colocate_memory import GB, MODELS, Shape, update_working_set, workload_parser

WORLD_SIZES = (1, 2, 4, 8)


def rank_memory(shape: Shape, world: int, args: argparse.Namespace) -> tuple[float, float]:
    """(GB on each rank's GPU during the update, GB of host memory per rank)."""
    b = 2
    total, _ = shape.parameters()
    H, V = shape.hidden, shape.vocab
    root = V * H * (1 if shape.tied else 2) + H
    layer = (total - root) / shape.layers
    device = (
        16 * total / world + b * total + 4 * root + 12 * layer + update_working_set(shape, args, b)
    )
    return device / GB, 16 * total / world / GB


def main() -> None:
    args = workload_parser(__doc__.splitlines()[0]).parse_args()
    header = " | ".join(f"W = {w}: GPU GB (fits)" for w in WORLD_SIZES)
    print(f"| model | params | {header} | host GB per rank, W = 1 … 8 |")
    print("|---|---|" + "---|" * len(WORLD_SIZES) + "---|")
    for shape in MODELS:
        cells, host = [], []
        for world in WORLD_SIZES:
            device, host_gb = rank_memory(shape, world, args)
            fits = "**yes**" if device <= args.gpu_gb else "no"
            cells.append(f"{device:.0f} ({fits})")
            host.append(f"{host_gb:.0f}")
        params = shape.parameters()[0] / 1e9
        print(f"| {shape.name} | {params:.2f}B | " + " | ".join(cells) + f" | {' / '.join(host)} |")


if __name__ == "__main__":
    main()
