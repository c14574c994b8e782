"""`satseq plan`: the device memory a config needs, predicted from the models' configs alone,
against the peaks measured on an H100 (bench/results/gpu_sheet_h100.json), and against fake-tensor
accounting at other shapes."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from transformers import Qwen2Config
from typer.testing import CliRunner

from satseq.actors.learner.specs import (
    SMALL_SNAPSHOT,
    CheckpointChoices,
    TokenBudget,
    snapshot_on_device,
)
from satseq.cli.main import app
from satseq.launch.memory_plan import (
    GIB,
    PROMPT_TOKENS,
    USABLE,
    LearnerUpdate,
    Workload,
    activation_profile,
    lora_parameter_count,
    saved_bytes,
    strides,
)

ROOT = Path(__file__).resolve().parents[1]
SHEET = json.loads((ROOT / "bench" / "results" / "gpu_sheet_h100.json").read_text())


def sheet_shapes():
    sys.path.insert(0, str(ROOT / "bench"))
    from learner_workload import SIZES

    return SIZES


def test_the_plan_predicts_the_peaks_measured_on_an_h100():
    """Every learner mode at 0.5B and 1.5B (16 sequences of 512 + 1536 tokens, bf16 compute,
    the sheet's micro-batches), within 5 % of the measured peak; the 4B exact update, which ran
    out of memory on the 80 GB card, does not fit it."""
    shapes = sheet_shapes()
    errors = {}
    for size, entry in SHEET["sizes"].items():
        config, plan = Qwen2Config(**shapes[size]), entry["plan"]
        workload = Workload(plan["micro_batch"], 512, 1536, trajectories=16)
        for mode, row in entry["rows"].items():
            if mode == "bare":  # the sheet's own loop, not the learner
                continue
            lora = lora_parameter_count(config, 16) if mode == "lora" else None
            predicted = sum(
                LearnerUpdate(
                    config, "bfloat16", workload, exact_kl=mode == "exact", chunk_tokens=1024,
                    checkpoint_every=1 if plan["checkpointing"] else None, lora_parameters=lora,
                ).peak().values()
            )  # fmt: skip
            if "peak_gib" in row:
                errors[size, mode] = predicted / row["peak_gib"] - 1
            else:
                assert "out of memory" in row["error"]
                assert predicted > USABLE * 79.2  # what an 80 GB H100 gives torch
    assert len(errors) == 8
    assert max(abs(e) for e in errors.values()) < 0.05, errors


def test_fake_tensor_accounting_is_linear_in_the_tokens():
    """The per-token bytes come from fake forwards at 128 and 256 tokens; one at 640 lands on the
    same line (no term grows faster than the tokens: flash-style attention keeps no [L, L]), and
    the parameters are the model's own count."""
    from transformers import Qwen2ForCausalLM

    config = Qwen2Config(**sheet_shapes()["small"])
    P, per_token = activation_profile(config, "bfloat16")
    _, at_128 = saved_bytes(config, 128, "bfloat16")
    _, at_640 = saved_bytes(config, 640, "bfloat16")
    assert at_640 == pytest.approx(at_128 + 512 * per_token, rel=0.01)
    assert sum(p.numel() for p in Qwen2ForCausalLM(config).parameters()) == P
    # at least each layer's input in the compute dtype, at most a few dozen copies of it
    layer_input = config.num_hidden_layers * config.hidden_size * 2
    assert layer_input < per_token < 100 * layer_input


def test_the_lora_count_is_pefts(raw_tiny_model):
    from peft import get_peft_model

    from satseq.models import load_policy
    from satseq.models.adapters import LoraSpec, lora_config

    model, _ = load_policy(raw_tiny_model, "float32")
    adapted = get_peft_model(model, lora_config(model, LoraSpec(rank=8, alpha=16.0)))
    trained = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert lora_parameter_count(model.config, 8) == trained


def test_the_shipped_seeds_layout_fits_and_one_gpu_an_agent_does_not():
    runner = CliRunner()
    fits = runner.invoke(app, ["plan", "configs/sat_seq.yaml"])
    assert fits.exit_code == 0, fits.output
    crowded = runner.invoke(app, ["plan", "configs/sat_seq.yaml", "trainer.workers_per_agent=1"])
    assert crowded.exit_code == 1
    assert "does not fit: learner solver_a, update: 85.9 GiB" in crowded.output
    shared = runner.invoke(
        app, ["plan", "configs/sat_seq.yaml", "rollout.gpu_memory_utilization=0.5"]
    )
    assert shared.exit_code == 1 and "rollout actor 0, rollout: 120.0 GiB" in shared.output
    unknown = runner.invoke(
        app, ["plan", "configs/sat_seq.yaml", "team.agents.0.path=no/such-model"]
    )
    assert unknown.exit_code == 2 and "no/such-model" in unknown.output


def test_a_token_budget_fills_its_share_of_the_device_and_not_a_token_more():
    """`TokenBudget.tokens`: at the budget the predicted peak is within USABLE of the share, at
    one more token over it; where state and the step alone do not fit, no micro-batch does."""
    config = Qwen2Config(**sheet_shapes()["small"])
    share, device = 0.5, 8 * GIB
    base = LearnerUpdate(
        config, "bfloat16", Workload(10**6, 512, 1536, trajectories=16),
        exact_kl=True, checkpoint_every=None, chunk_tokens=1024,
    )  # fmt: skip
    tokens = base.token_budget(share).tokens(device)

    def peak(max_tokens: int) -> float:
        workload = dataclasses.replace(base.workload, max_tokens=max_tokens)
        return sum(dataclasses.replace(base, workload=workload).peak().values()) * GIB

    assert tokens > 2048  # more than one trajectory: the budget binds, not the length
    assert peak(tokens) <= USABLE * share * device < peak(tokens + 1)
    assert base.token_budget(share).tokens(0.01 * GIB) == 0


def test_auto_micro_batches_are_planned_on_a_gpu_and_left_alone_on_the_cpu():
    from satseq.actors.learner.specs import LossSpec, TrustRegionSpec
    from satseq.cluster.learner_specs import LearnerSettings, learner_spec
    from satseq.config import load_config
    from satseq.launch.memory_plan import agent_update

    runner = CliRunner()
    auto = ["plan", "configs/sat_seq.yaml", "trainer.max_tokens_per_micro_batch=auto"]
    planned = runner.invoke(app, auto, env={"COLUMNS": "250"})
    assert planned.exit_code == 0, planned.output
    budget = agent_update(load_config("configs/sat_seq.yaml"), 0, PROMPT_TOKENS).token_budget(1.0)
    assert f"micro-batches of at most {budget.tokens(80 * GIB):,} tokens" in planned.output
    crowded = runner.invoke(app, [*auto, "trainer.workers_per_agent=1"], env={"COLUMNS": "250"})
    assert crowded.exit_code == 1 and "no micro-batch fits beside the rest" in crowded.output

    config = load_config("configs/sat_seq.yaml", ["trainer.max_tokens_per_micro_batch=auto"])
    on_gpu = learner_spec(config, 0, LearnerSettings(LossSpec(), TrustRegionSpec()), "cuda", 1)
    on_cpu = learner_spec(config, 0, LearnerSettings(LossSpec(), TrustRegionSpec()), "cpu", 1)
    assert on_gpu.token_budget == budget and on_gpu.max_tokens_per_micro_batch is None
    assert on_cpu.token_budget is None and on_cpu.max_tokens_per_micro_batch is None


def test_checkpointing_strides_and_their_activations_by_hand():
    """`strides`: none, then the most even stride for each count of checkpointed layers (L = 5:
    layers {0}, {0, 3}, {0, 2, 4}, all). A stride k keeps the c = ⌈L/k⌉ checkpointed layers'
    float32 inputs, the other L − c layers' saved tensors, and one layer's again while it is
    recomputed; a = the per-token bytes of one layer without checkpointing."""
    assert strides(5) == [None, 5, 3, 2, 1]
    assert strides(4) == [None, 4, 2, 1]
    assert strides(1) == [None, 1]
    config = Qwen2Config(**sheet_shapes()["small"])
    L, H = config.num_hidden_layers, config.hidden_size
    a = activation_profile(config, "bfloat16")[1] / L
    base = LearnerUpdate(
        config, "bfloat16", Workload(1, 0, 1000, trajectories=1),
        exact_kl=False, checkpoint_every=None, chunk_tokens=1024,
    )  # fmt: skip
    for every in strides(L):
        update = dataclasses.replace(base, checkpoint_every=every)
        c = 0 if every is None else -(-L // every)
        expected = L * a if every is None else c * H * 4 + (L - c + 1) * a
        assert update.token_budget().per_token == pytest.approx(expected)
        assert update.peak()["activations"] * GIB == pytest.approx(1000 * expected)


def test_auto_checkpointing_recomputes_the_fewest_layers_at_which_a_micro_batch_fits():
    """By hand: three strides whose budgets hold 5, 50 and 500 tokens on a device; a micro-batch
    of 40 tokens takes the second, of 400 the third, of 4,000 (nothing fits) the last."""
    budgets = tuple(
        (every, TokenBudget(fixed=0, state=0, step=0, per_token=per_token, share=1, usable=1))
        for every, per_token in ((None, 20.0), (4, 2.0), (1, 0.2))
    )
    assert CheckpointChoices(budgets, 40).choose(100)[0] == 4
    assert CheckpointChoices(budgets, 400).choose(100)[0] == 1
    assert CheckpointChoices(budgets, 4000).choose(100)[0] == 1
    assert CheckpointChoices(budgets, 5).choose(100)[0] is None


def test_auto_checkpointing_is_planned_on_a_gpu_and_every_layer_on_the_cpu():
    """`satseq plan` names the stride it chose (the seeds' 4B at micro-batch 4 needs every
    layer on 80 GB; at micro-batch 1 on an H200's 141 GB, none); the learner spec carries the
    choices on a GPU and checkpoints every layer on the CPU."""
    from satseq.actors.learner.specs import LossSpec, TrustRegionSpec
    from satseq.cluster.learner_specs import LearnerSettings, learner_spec
    from satseq.config import load_config

    runner = CliRunner()
    auto = ["plan", "configs/sat_seq.yaml", "trainer.gradient_checkpointing=auto"]
    every = runner.invoke(app, auto, env={"COLUMNS": "250"})
    assert every.exit_code == 0 and "update (every layer checkpointed)" in every.output
    roomy = [*auto, "trainer.micro_batch_size=1", "--gpu-gib", "141"]
    none = runner.invoke(app, roomy, env={"COLUMNS": "250"})
    assert none.exit_code == 0 and "update (no layer checkpointed; snapshot" in none.output

    config = load_config("configs/sat_seq.yaml", ["trainer.gradient_checkpointing=auto"])
    settings = LearnerSettings(LossSpec(), TrustRegionSpec())
    on_gpu = learner_spec(config, 0, settings, "cuda", 1)
    on_cpu = learner_spec(config, 0, settings, "cpu", 1)
    assert [every for every, _ in on_gpu.checkpoint_choices.budgets] == strides(36)
    assert on_gpu.checkpoint_choices.wanted_tokens == 4 * (PROMPT_TOKENS + 4096)
    assert on_gpu.token_budget is None  # micro-batches are not auto here
    assert on_cpu.checkpoint_choices is None and on_cpu.checkpoint_every == 1


def test_the_snapshot_goes_on_the_device_where_a_configured_micro_batch_fits_beside_it():
    """By hand: 90 % of 100 bytes is 90, 10 fixed, 1 byte a token, a micro-batch of 40 tokens.
    A 50-byte snapshot leaves 30 tokens (host memory), a 40-byte one 40 (the device); reserved,
    the budget shrinks by the snapshot's bytes. A snapshot of at most 1/64 of the device goes
    there without a plan; a larger one without a plan stays in host memory."""
    budget = TokenBudget(fixed=10, state=4, step=2, per_token=1, share=1, usable=0.9, wanted=40)
    assert budget.tokens(100) == 80 and budget.tokens(100, reserved=40) == 40
    assert not snapshot_on_device(budget, 50, 100)
    assert snapshot_on_device(budget, 40, 100)
    assert snapshot_on_device(None, SMALL_SNAPSHOT * 6400, 6400)
    assert not snapshot_on_device(None, SMALL_SNAPSHOT * 6400 + 1, 6400)


def test_the_plan_keeps_the_seeds_snapshot_on_an_h200_and_in_host_memory_on_80_gb():
    """The seeds' 4B ranks (W = 2): on 80 GB the snapshot (12·P/W, 22.5 GiB) would leave no room
    for a micro-batch of 4 × (512 + 4,096) tokens, on an H200's 141 GB it does, and the update's
    peak counts it; GRPO has no snapshot. The learner spec carries the budget the learner
    decides with on its own device."""
    from satseq.actors.learner.specs import LossSpec, TrustRegionSpec
    from satseq.cluster.learner_specs import PLAIN_STEPS, LearnerSettings, learner_spec
    from satseq.config import load_config
    from satseq.launch.memory_plan import learner_phase

    config = load_config("configs/sat_seq.yaml", [])
    small, _ = learner_phase(config, 0, 80, PROMPT_TOKENS)
    roomy, update = learner_phase(config, 0, 141, PROMPT_TOKENS)
    assert "snapshot" not in small.phase and "snapshot" not in small.parts
    assert roomy.phase == "update (snapshot on the device)"
    snapshot = 12 * activation_profile(update.config, "bfloat16")[0] / 2
    assert roomy.parts["snapshot"] * GIB == pytest.approx(snapshot)
    assert sum(roomy.parts.values()) == pytest.approx(sum(small.parts.values()) + snapshot / GIB)
    grpo = load_config("configs/sat_seq.yaml", ["algorithm.name=grpo"])
    assert "snapshot" not in learner_phase(grpo, 0, 141, PROMPT_TOKENS)[0].phase

    budget = learner_spec(config, 0, LearnerSettings(LossSpec(), TrustRegionSpec()), "cuda", 1)
    assert budget.snapshot_budget.wanted == 4 * (PROMPT_TOKENS + 4096)
    assert not snapshot_on_device(budget.snapshot_budget, snapshot, 80 * GIB)
    assert snapshot_on_device(budget.snapshot_budget, snapshot, 141 * GIB)
    plain = learner_spec(config, 0, LearnerSettings(LossSpec(), PLAIN_STEPS), "cuda", 1)
    on_cpu = learner_spec(config, 0, LearnerSettings(LossSpec(), TrustRegionSpec()), "cpu", 1)
    assert plain.snapshot_budget is None and on_cpu.snapshot_budget is None

    # a learner that lends its device between updates keeps the snapshot in host memory
    lends = load_config("configs/sat_seq.yaml", ["team.agents.0.offload=idle_agents"])
    assert "snapshot" not in learner_phase(lends, 0, 141, PROMPT_TOKENS)[0].phase
    assert "snapshot" in learner_phase(lends, 1, 141, PROMPT_TOKENS)[0].phase
    spec = learner_spec(lends, 0, LearnerSettings(LossSpec(), TrustRegionSpec()), "cuda", 1)
    assert spec.snapshot_budget is None


def test_gradient_checkpointing_is_read_as_a_stride_and_bad_values_name_the_key():
    from satseq.config import ConfigError, load_config

    for value, every in (("true", 1), ("false", None), ("3", 3), ("auto", 1)):
        config = load_config(None, [f"trainer.gradient_checkpointing={value}"])
        assert config.trainer.checkpoint_every == every
    with pytest.raises(ConfigError, match=r"trainer\.gradient_checkpointing"):
        load_config(None, ["trainer.gradient_checkpointing=often"])
