"""The learner benchmarks' workload (`bench_learner.py`, `gpu_sheet.py`): random-init Qwen2-shaped
models built from a config (nothing is downloaded), random trajectories, the learner in each
update mode, and the bare training loop it is measured against.

Only torch, transformers and satseq's learner are imported (no Ray, no vLLM), so this runs on a
bare GPU machine with the repository on PYTHONPATH.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch

SIZES = {  # Qwen2 shapes; vocabularies as large as real models', where the memory goes
    "tiny": dict(  # the CPU path of the test suite: seconds
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        tie_word_embeddings=True,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "smollm2": dict(  # SmolLM2-135M's shapes (a Llama) in a Qwen2: 135M parameters
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "0.5b": dict(  # Qwen2-0.5B
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(  # Qwen2-1.5B
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "4b": dict(  # Qwen1.5-4B (Qwen2 architecture in transformers)
        hidden_size=2560,
        intermediate_size=6912,
        num_hidden_layers=40,
        num_attention_heads=20,
        num_key_value_heads=20,
        vocab_size=151936,
        tie_word_embeddings=False,
    ),
}
MODES = ("exact", "k3", "plain", "lora")
BARE_MODES = ("bare", "bare+check", "bare+kl-check")
BARE_CHECKS = {"bare": None, "bare+check": "tokens", "bare+kl-check": "vocabulary"}
"""Each bare mode's check pass (`bare_step`'s `check`)."""
BASELINE = {"exact": "bare+kl-check", "k3": "bare+check"} | dict.fromkeys(
    ("plain", "lora", *BARE_MODES), "bare"
)
"""What each mode's throughput is compared with: the bare loop, plus the forward pass the trust
region's check needs where the mode checks (k3's: the response log-probs; exact's: those and
the exact KL over the vocabulary against π_cur)."""
"""The learner's update modes: SAT-Seq's trust region with the exact vocabulary KL or k3, plain
PPO-clip steps as GRPO takes them (no measuring pass after the step), and the exact mode on a
LoRA agent ([3.3], where it has landed)."""


def build_model(size: str, directory: Path, device: str = "cpu", dtype=torch.float32) -> str:
    """A random-init Qwen2 of `size`, initialised on `device` and saved in `dtype`, with a small
    byte-level tokenizer (the token ids are random anyway); returns its directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from satseq.models.tokenizer import train_tokenizer

    out = directory / size
    torch.manual_seed(0)
    config = Qwen2Config(**SIZES[size], max_position_embeddings=4096)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(out)
    del model
    train_tokenizer(["a random-init model's tokenizer"], vocab_size=300).save_pretrained(out)
    return str(out)


def random_trajectories(
    sequences: int,
    prompt_len: int,
    response_len: int,
    vocab: int,
    group_size: int = 1,
    prompts: list[list[int]] | None = None,
    varied: bool = False,
):
    """`sequences` trajectories of random tokens, agent 0's; each run of `group_size` rows shares
    its prompt, as a GRPO group's samples do: `prompts[k]` (token ids) where given, else
    `prompt_len` random tokens. Responses of `response_len` tokens, or where `varied` of
    lengths spread as rollouts' are (`rollout_lengths`)."""
    from satseq.actors.trajectory import Trajectory

    g = torch.Generator().manual_seed(0)
    groups = -(-sequences // group_size)
    if prompts is None:
        prompts = [
            torch.randint(5, vocab, (prompt_len,), generator=g).tolist() for _ in range(groups)
        ]
    lengths = rollout_lengths(sequences, response_len) if varied else [response_len] * sequences
    return [
        Trajectory(
            i // group_size,
            prompts[i // group_size],
            torch.randint(5, vocab, (R,), generator=g).tolist(),
            [1] * R,
            [0] * R,
            "length",
        )
        for i, R in enumerate(lengths)
    ]


def workload_tokens(sequences: int, prompt_len: int, response_len: int, varied: bool) -> int:
    """The tokens of `random_trajectories(sequences, prompt_len, response_len, ...)`."""
    responses = rollout_lengths(sequences, response_len) if varied else [response_len] * sequences
    return sequences * prompt_len + sum(responses)


def rollout_lengths(sequences: int, limit: int) -> list[int]:
    """Response lengths spread as sampled ones are: every fourth cut at the `limit`, the rest
    limit · u² for u uniform on (0, 1] (most short): half of a padded batch's response
    positions are padding, as in the H100 diagnosis's real batches (50–70 %)."""
    g = torch.Generator().manual_seed(1)
    u = torch.rand(sequences, generator=g)
    return [limit if i % 4 == 3 else max(1, round(limit * float(x) ** 2)) for i, x in enumerate(u)]


def lora_missing() -> str | None:
    """Why a LoRA agent ([3.3]) cannot be measured here, or None when it can: the learner takes
    an adapter directory (`satseq.models.adapters`) and peft is installed."""
    import importlib.util

    if importlib.util.find_spec("satseq.models.adapters") is None:
        return "LoRA agents ([3.3]) have not landed (no satseq.models.adapters)"
    if importlib.util.find_spec("peft") is None:
        return "peft is not installed"
    return None


def learner_spec(mode: str, path: str, lora_rank: int = 16, **settings):
    """The `LearnerSpec` of `mode` (see MODES) on the model at `path`; `settings` are
    LearnerSpec's other fields. `lora` trains a fresh rank-`lora_rank` adapter (alpha 2·rank,
    every linear layer but the output layer) made beside `path`. The trust region's target is
    one no step reaches: each update is one accepted step, timed alike in every mode."""
    from satseq.actors.learner import LearnerSpec, LossSpec, TrustRegionSpec

    loss = LossSpec(ratio="token", aggregation="token_mean") if mode == "plain" else LossSpec()
    trust_region = TrustRegionSpec(
        enabled=mode != "plain",
        measure=mode != "plain",  # GRPO's plain steps: no pass after the step
        target_kl=1e9,
        kl_estimator="k3" if mode in ("k3", "plain") else "exact",
    )
    if mode == "lora":
        from satseq.models.adapters import LoraSpec, initial_adapter

        adapters = Path(path).parent / "adapters"
        path = str(initial_adapter(path, LoraSpec(lora_rank, 2.0 * lora_rank), 0, adapters))
    return LearnerSpec(
        model_path=path, agent_index=0, loss=loss, trust_region=trust_region, **settings
    )


def bare_step(policy, trajectories, check: str | None = None) -> None:
    """The baseline, a good training loop on the learner's own model, optimiser, micro-batches
    and kernels: the trunk's forward (packed without padding, as the learner packs), the
    fused output layer's log-probs of the response tokens, cross-entropy (their token mean),
    backward, gradient clipping and AdamW (fused on CUDA), each weight cast once a step.
    `policy`: an `AgentPolicy`. `check`: then one forward pass without gradients over the
    batch, the pass a trust-region check adds: `tokens`, the response log-probs (what k3's
    check computes); `vocabulary`, those and the exact KL(π_θ ‖ π_cur) over the vocabulary,
    against π_cur's output layer and hidden states kept from the step's forward (what exact's
    check computes, from what the learner keeps)."""
    from satseq.actors.forward import response_hidden_states, response_positions
    from satseq.algo.lm_head import chunked_logprobs_and_kl

    chunk_tokens = policy.spec.logit_chunk_tokens
    reference, kept = None, []  # π_cur's output layer and states, for the exact check

    def forward(batch, reference_hidden=None):
        where = response_positions(batch)
        with policy.autocast():
            hidden, layer = response_hidden_states(policy.trunk, batch)
            states = hidden[where]
            logp, _ = chunked_logprobs_and_kl(
                states, batch.response_ids[where], layer, 1.0, reference_hidden,
                None if reference_hidden is None else reference, chunk_tokens,
            )  # fmt: skip
        return logp, states, layer

    policy.optimizer.zero_grad(set_to_none=True)
    with policy.cast_once():
        for _, batch in policy.micro_batches(trajectories):
            batch = batch.to(policy.device)
            logp, states, layer = forward(batch)
            if check == "vocabulary":
                reference = reference or layer.detached_copy(policy.reference_dtype)
                kept.append(states.detach().to(policy.reference_dtype))
            loss = -logp.sum() / batch.response_lengths.sum()
            (loss * len(batch.input_ids) / len(trajectories)).backward()
    torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
    policy.optimizer.step()
    if check is not None:
        with torch.no_grad(), policy.cast_once():
            for i, (_, batch) in enumerate(policy.micro_batches(trajectories)):
                forward(batch.to(policy.device), kept[i] if kept else None)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(step, repeats: int, device: str, prepare=None, warm_up: bool = True) -> float:
    """Seconds per call of `step`, after one warm-up call (unless not `warm_up`); `prepare()`
    runs untimed before each call."""
    total = 0.0
    for call in range(0 if warm_up else 1, repeats + 1):
        if prepare is not None:
            prepare()
        synchronize(device)
        started = time.perf_counter()
        step()
        synchronize(device)
        total += (time.perf_counter() - started) if call else 0.0
    return total / repeats


def time_mode(
    learner, mode: str, trajectories, repeats: int, device: str, warm_up: bool = True
) -> dict:
    """Seconds per step of `mode` (one of BARE_MODES or MODES) on `learner`, after a warm-up
    (unless not `warm_up`: the caller ran one). Each
    update starts a stage: SAT-Seq's modes at logp_cur of the weights it starts from, from a
    separate pass (untimed), GRPO's `plain` from its first forward; an update timed against an
    older logp_cur would time ratios that drift further at every repeat. For the update modes,
    the backtracks and rejected epochs of the timed updates (the trust region's target is out
    of reach: each should be one accepted step)."""
    A = torch.linspace(-1, 1, len(trajectories))
    c = torch.ones(len(trajectories))
    if mode in BARE_MODES:
        step = functools.partial(bare_step, learner.policy, trajectories, BARE_CHECKS[mode])
        return {"seconds": timed(step, repeats, device, warm_up=warm_up)}
    stage = {"logp_cur": None}
    results = []

    def new_stage() -> None:
        stage["logp_cur"] = learner.logprobs(trajectories)

    seconds = timed(
        lambda: results.append(learner.update(trajectories, stage["logp_cur"], A, c)),
        repeats,
        device,
        prepare=None if mode == "plain" else new_stage,
        warm_up=warm_up,
    )
    steps = [step for result in results for step in result.steps]
    return {
        "seconds": seconds,
        "backtracks": sum(step.backtracks for step in steps),
        "not_applied": sum(not step.applied for step in steps),
    }


SNAPSHOT_COSTS = ("snapshot_s", "snapshot_exposed_s", "restore_s")


def backtrack_costs(policy, device: str) -> dict:
    """A backtrack's parts besides the retried step: the snapshot taken before every step
    (buffers allocated by an earlier one) and its restore, in seconds, and its size. The
    snapshot's `snapshot_s` waits for its copies; `snapshot_exposed_s` only until `save`
    returns (on a GPU its copies then run on their own stream, beside the step's passes). In
    host memory, and (`device_…`) in an arena on the accelerator, where the learner keeps it
    when memory allows (`specs.snapshot_on_device`; None: it did not fit; on the CPU both are
    host memory)."""
    from satseq.actors.learner.snapshot import TrainingSnapshot

    costs = {}
    for prefix, on_device in (("", False), ("device_", True)):
        policy.snapshot = TrainingSnapshot(on_device=on_device)
        try:
            seconds = timed(policy.save_snapshot, 1, device)  # its warm-up lays the arena out
        except torch.OutOfMemoryError:
            costs |= dict.fromkeys([f"{prefix}{k}" for k in SNAPSHOT_COSTS])
            continue
        synchronize(device)
        started = time.perf_counter()
        policy.save_snapshot()
        exposed = time.perf_counter() - started
        costs |= {
            f"{prefix}snapshot_s": seconds,
            f"{prefix}snapshot_exposed_s": exposed,
            f"{prefix}restore_s": timed(lambda: policy.restore(policy.snapshot), 1, device),
        }
        costs.setdefault("snapshot_gib", policy.snapshot.nbytes / 2**30)
    policy.snapshot = TrainingSnapshot()  # the device arena freed
    return costs
