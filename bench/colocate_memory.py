"""What fits on one 80 GB GPU: a team of n agents of one size, learners and vLLM engines on the
same GPU, with and without `trainer.offload: idle_agents` (README "A whole team on one GPU").

Computed, not measured: the numbers come from the learner's memory formula (README "The learner
on real hardware") and the models' shapes; no GPU is needed. Bytes per parameter (b = 2, bf16
compute):

    learner between updates, resident     16   fp32 master 4, gradients 4, AdamW moments 8
    learner between updates, offloaded    0    (during one of its forward passes: b for the
                                               nn.Linear weights, 4 for embeddings and norms)
    learner during its update             16 + b   autocast's compute-dtype copies on top
    rollout engine (vLLM)                 b    plus its KV cache; 0 while asleep (offload only)
    host memory per learner               16   the backtracking snapshot (pinned)
                                        + 12   offloaded masters and moments (offload only)

The update also needs its working set: π_cur's output layer and hidden states (b·V·H + b·M·H),
one micro-batch's checkpointed activations (~ layers·n·L·H·b) and one chunk's float32 logits
(≈ 16·C·V). A team fits when each phase fits in --gpu-gb, the phases with awake engines with at
least --kv-cache-gb to spare for the engines' KV cache:

    none          one phase: everything resident all the time (n learners, the updating one's
                  extra, n engines, their KV cache)
    idle_agents   update: the updating learner alone, the engines asleep;
                  log-probs: the n learners' forward copies at once, the engines asleep;
                  generation: n engines + their KV cache

LoRA agents (design §12), n adapters of rank r on one base, a = r · Σ (in + out) over the
adapted linear layers (all-linear) parameters each:

    learners' base                b · Ψ once (`--lora-bases 1`: the learners share it) or n times
                                  (each learner process its own copy)
    each learner's adapter        16 · a resident (float32 master, gradient, AdamW moments), its
                                  snapshot 4 · a in host memory; the base is never offloaded
    the engine                    b · Ψ + n · b · a, one for the n agents, asleep in updates

    update                        bases + n adapters + the working set (the engine asleep)
    log-probs                     bases + n adapters (the engine asleep)
    generation                    bases + n adapters + the engine, and its KV cache

    python bench/colocate_memory.py                # the README table
    python bench/colocate_memory.py --gpu-gb 141 --agents 1 3 5
    python bench/colocate_memory.py --gpu-gb 24 --agents 3 --lora-rank 16   # LoRA teams
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (its HF config), enough to count its parameters."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3

    def parameters(self) -> tuple[int, int]:
        """(all parameters, those outside nn.Linear layers: embeddings and norms)."""
        H, D = self.hidden, self.head_dim
        q, kv = self.heads * D, self.kv_heads * D
        attention = H * q + 2 * H * kv + q * H + (q + 2 * kv if self.qkv_bias else 0)
        linear_per_layer = attention + 3 * H * self.intermediate
        norms_per_layer = 2 * H + (2 * D if self.qk_norm else 0)
        embedding = self.vocab * H
        head = 0 if self.tied else self.vocab * H
        linear = self.layers * linear_per_layer + head
        other = self.layers * norms_per_layer + embedding + H
        return linear + other, other


MODELS = [
    Shape("Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 64, 151936, True, True, False),
    Shape("Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 128, 151936, True, True, False),
    Shape("Qwen3-4B", 2560, 9728, 36, 32, 8, 128, 151936, True, False, True),
    Shape("Qwen3-8B", 4096, 12288, 36, 32, 8, 128, 151936, False, False, True),
]


def update_working_set(shape: Shape, args: argparse.Namespace, b: int) -> float:
    """Bytes the update needs beyond the weights: π_cur's output layer and hidden states, one
    micro-batch's checkpointed activations, one chunk's float32 logits."""
    H, V = shape.hidden, shape.vocab
    reference = b * V * H + b * args.response_tokens * H
    activations = shape.layers * args.micro_batch * args.seq_len * H * b
    return reference + activations + 16 * args.chunk_tokens * V


def team_memory(shape: Shape, n: int, args: argparse.Namespace) -> dict[str, float]:
    """GB for n agents: each phase's device memory before the KV cache, and host memory."""
    b = 2
    total, float32_kept = shape.parameters()
    resident = 16 * total
    offloaded = b * (total - float32_kept) + 4 * float32_kept
    updating = resident + b * total + update_working_set(shape, args, b)
    engines = n * b * total
    return {
        "params_b": total / 1e9,
        "none": ((n - 1) * resident + updating + engines) / GB,
        "offload_update": updating / GB,
        "offload_logprobs": n * offloaded / GB,
        "offload_generation": engines / GB,
        "host_none": n * 16 * total / GB,
        "host_offload": n * (16 + 12) * total / GB,
    }


def adapter_parameters(shape: Shape, rank: int) -> int:
    """a: a rank-r adapter on every linear layer of the decoder (all-linear)."""
    H, F = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = (H + q) * 2 + (H + kv) * 2 + (H + F) * 3  # q, o; k, v; gate, up, down
    return rank * shape.layers * per_layer


def lora_team_memory(
    shape: Shape, n: int, rank: int, bases: int, args: argparse.Namespace
) -> dict[str, float]:
    """GB of each phase of n LoRA agents on one GPU, the learners holding `bases` copies of the
    base (1: shared; n: one per learner process), the engine asleep but in generation."""
    b = 2
    total, _ = shape.parameters()
    a = adapter_parameters(shape, rank)
    learners = bases * b * total + n * 16 * a
    engine = b * total + n * b * a
    return {
        "adapter_m": a / 1e6,
        "update": (learners + update_working_set(shape, args, b)) / GB,
        "logprobs": learners / GB,
        "generation": (learners + engine) / GB,
    }


def workload_parser(description: str) -> argparse.ArgumentParser:
    """The GPU and the update's workload, as every memory table here takes them."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gpu-gb", type=float, default=80.0)
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch")
    parser.add_argument("--seq-len", type=int, default=2048, help="prompt + response tokens")
    parser.add_argument(
        "--response-tokens", type=int, default=128 * 1536, help="M: the update's response tokens"
    )
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="trainer.logit_chunk_tokens")
    return parser


def main() -> None:
    parser = workload_parser(__doc__.splitlines()[0])
    parser.add_argument("--kv-cache-gb", type=float, default=4.0, help="the least that fits")
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--lora-rank", type=int, default=None, help="also the LoRA teams' table")
    args = parser.parse_args()

    def fits(*phases: float) -> str:
        """The last phase runs the engines: it needs room for their KV cache."""
        room = args.gpu_gb - phases[-1]
        return "**yes**" if max(phases) <= args.gpu_gb and room >= args.kv_cache_gb else "no"

    print(
        "| model | n | none: GB | fits | idle_agents: update GB | log-probs GB | generation GB "
        "| fits | host GB, none / idle_agents |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in MODELS:
        for n in args.agents:
            m = team_memory(shape, n, args)
            print(
                f"| {shape.name} ({m['params_b']:.2f}B) | {n} | {m['none']:.0f} "
                f"| {fits(m['none'])} | {m['offload_update']:.0f} "
                f"| {m['offload_logprobs']:.0f} | {m['offload_generation']:.0f} "
                f"| {fits(m['offload_update'], m['offload_logprobs'], m['offload_generation'])} "
                f"| {m['host_none']:.0f} / {m['host_offload']:.0f} |"
            )
    if args.lora_rank:
        print_lora_table(args, fits)


def print_lora_table(args: argparse.Namespace, fits) -> None:
    """n LoRA agents of rank `--lora-rank` on one base against n full agents (idle_agents)."""
    print(f"\nLoRA agents of rank {args.lora_rank}, one engine; GB per phase")
    print(
        "| model | n | adapter M | full agents: update / log-probs / generation | fits "
        "| LoRA, one base per learner | fits | LoRA, one base shared | fits |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in MODELS:
        for n in args.agents:
            full = team_memory(shape, n, args)
            phases = [full["offload_update"], full["offload_logprobs"], full["offload_generation"]]
            cells = [" / ".join(f"{p:.1f}" for p in phases), fits(*phases)]
            for bases in (n, 1):
                lora = lora_team_memory(shape, n, args.lora_rank, bases, args)
                phases = [lora["update"], lora["logprobs"], lora["generation"]]
                cells += [" / ".join(f"{p:.1f}" for p in phases), fits(*phases)]
            adapter = lora_team_memory(shape, n, args.lora_rank, 1, args)["adapter_m"]
            print(f"| {shape.name} | {n} | {adapter:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
