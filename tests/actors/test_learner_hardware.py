"""The learner as real hardware sees it ([2.1]): tensors on the model's device, float32 master
weights under bf16 compute, no [tokens, vocabulary] tensor beyond one chunk, the exact KL
without a model copy, token-budget micro-batches, and gradient checkpointing that changes
memory, not results. All on the CPU, built so that a device or memory bug shows up here."""

import copy
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from satseq.actors.learner import Learner, LearnerSpec, LossSpec, OptimizerSpec, TrustRegionSpec
from satseq.actors.learner.specs import TokenBudget
from satseq.actors.trajectory import Trajectory, pad_batch
from satseq.algo.kl import kl_exact, kl_quantile, sequence_kl
from tests.actors.tensor_guards import LargestVocabularyTensor, NamedDevices


def batch(tokenizer, n=6, owners=None):
    out = []
    for i in range(n):
        prompt = tokenizer.encode(f"{i}+{2 * i}=", add_special_tokens=False)
        response = tokenizer.encode(
            f"{3 * i} \\boxed{{{3 * i}}}" + " ok" * i, add_special_tokens=False
        )
        owner = 0 if owners is None else owners[i]
        out.append(
            Trajectory(i, prompt, response, [1] * len(response), [owner] * len(response), "stop")
        )
    return out


def learner(path, **overrides):
    spec = dict(
        model_path=path,
        agent_index=0,
        micro_batch_size=4,
        optimizer=OptimizerSpec(lr=1e-2),
        trust_region=TrustRegionSpec(target_kl=10.0),
    )
    return Learner(LearnerSpec(**(spec | overrides)))


def update(agent, trajectories, A=None):
    A = torch.linspace(-1, 1, len(trajectories)) if A is None else A
    logp_cur = agent.logprobs(trajectories)
    return agent.update(trajectories, logp_cur, A, torch.ones(len(trajectories))), logp_cur


# --- 1. device-correct -------------------------------------------------------------------------


def test_the_guard_catches_a_tensor_created_without_its_device():
    guard = NamedDevices(roots=(__file__,))
    with guard:
        torch.arange(3)  # the bug that crashed the learner's first GPU step
        torch.zeros(2, device="cpu")
        torch.ones(2, device="cpu").new_zeros(3)  # follows its input: fine
    assert len(guard.violations) == 1 and "torch.arange" in guard.violations[0]


@pytest.mark.parametrize(
    "loss, trust_region",
    [
        # exact KL; a tiny target forces backtracks, two steps reach the KL-penalty path
        (LossSpec(), TrustRegionSpec(target_kl=1e-9, max_backtracks=1)),
        (LossSpec(), TrustRegionSpec(target_kl=10.0, kl_estimator="k3")),
        (LossSpec(ratio="token", aggregation="token_mean"), TrustRegionSpec(enabled=False)),
    ],
    ids=["exact-backtracking", "k3", "plain"],
)
def test_every_tensor_the_learner_creates_names_its_device(raw_tiny_model, loss, trust_region):
    agent = learner(
        raw_tiny_model, loss=loss, trust_region=trust_region, ppo_epochs=2, value_lr=1e-2
    )
    trajectories = batch(agent.policy.tokenizer)
    guard = NamedDevices()
    with guard:
        result, _ = update(agent, trajectories)
        ones = torch.ones(len(trajectories))
        on_policy = agent.update(trajectories, None, ones, ones)  # π_old from its first pass
        agent.values(trajectories)
        agent.fit_values(trajectories, torch.ones(pad_batch(trajectories, 0).response_mask.shape))
        agent.weights()
        agent.state.state_dict()
    assert result.steps and on_policy.steps, "the updates must have run"
    assert guard.violations == []


# --- 2. mixed precision ------------------------------------------------------------------------


def changed_fraction(before, after, grads):
    """Of the parameter entries with a non-zero gradient, the share the step changed."""
    changed = touched = 0
    for name, grad in grads.items():
        nonzero = grad != 0
        touched += int(nonzero.sum())
        changed += int(((after[name] != before[name]) & nonzero).sum())
    return changed / touched


def test_bf16_compute_keeps_a_1e6_step_in_the_float32_master_weights(raw_tiny_model):
    agent = learner(
        raw_tiny_model,
        dtype="bfloat16",
        optimizer=OptimizerSpec(lr=1e-6),
        trust_region=TrustRegionSpec(enabled=False, kl_estimator="k3"),
        loss=LossSpec(ratio="token", aggregation="token_mean"),
    )
    assert all(p.dtype == torch.float32 for p in agent.policy.model.parameters())
    before = {n: p.detach().clone() for n, p in agent.policy.model.named_parameters()}
    names = {p: n for n, p in agent.policy.model.named_parameters()}
    grads = {}  # the step's gradients, as the optimiser saw them (freed right after the step)

    def keep_gradients(optimizer, args, kwargs):
        grads.update({names[p]: p.grad.clone() for p in names if p.grad is not None})

    agent.policy.optimizer.register_step_pre_hook(keep_gradients)
    update(agent, batch(agent.policy.tokenizer))
    assert grads and all(p.grad is None for p in names)  # nothing held after the step
    after = {n: p.detach() for n, p in agent.policy.model.named_parameters()}
    assert all(s["exp_avg"].dtype == torch.float32 for s in agent.policy.optimizer.state.values())
    assert changed_fraction(before, after, grads) >= 0.99

    # the same AdamW step applied to bf16 weights rounds most of it away (why masters are fp32)
    bf16 = {n: before[n].to(torch.bfloat16) for n in grads}
    stepped = {n: (before[n] + (after[n] - before[n])).to(torch.bfloat16) for n in grads}
    assert changed_fraction(bf16, stepped, grads) < 0.5


def test_bf16_checkpoints_and_engine_weights_are_in_the_compute_dtype(raw_tiny_model, tmp_path):
    agent = learner(raw_tiny_model, dtype="bfloat16")
    assert all(w.dtype == torch.bfloat16 for w in agent.weights().values())
    assert all(w.dtype == torch.float32 for w in agent.state.state_dict()["model"].values())
    saved = agent.save_pretrained(str(tmp_path / "hf"))
    assert {w.dtype for w in load_file(f"{saved}/model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = learner(saved)  # loads as float32 masters again
    bf16_values = {name: w.float() for name, w in agent.weights().items()}
    torch.testing.assert_close(reloaded.weights(), bf16_values, rtol=0, atol=0)
    assert all(p.dtype == torch.float32 for p in reloaded.policy.model.parameters())
    fp32 = learner(raw_tiny_model, dtype="bfloat16", save_dtype="float32")
    assert all(w.dtype == torch.float32 for w in fp32.weights().values())


def test_bf16_logprobs_stay_close_to_float32(raw_tiny_model):
    trajectories = batch(learner(raw_tiny_model).policy.tokenizer)
    fp32 = learner(raw_tiny_model).logprobs(trajectories)
    bf16 = learner(raw_tiny_model, dtype="bfloat16").logprobs(trajectories)
    mask = pad_batch(trajectories, 0).response_mask
    assert ((fp32 - bf16).abs() * mask).max() < 0.1
    assert not torch.equal(fp32 * mask, bf16 * mask)  # bf16 really ran


# --- 3. memory-lean log-probs and KL -----------------------------------------------------------


@pytest.mark.parametrize("estimator", ["exact", "k3"])
def test_no_vocabulary_tensor_exceeds_one_chunk(raw_tiny_model, estimator):
    chunk = 5
    agent = learner(
        raw_tiny_model,
        logit_chunk_tokens=chunk,
        trust_region=TrustRegionSpec(target_kl=1e-9, max_backtracks=1, kl_estimator=estimator),
        ppo_epochs=2,
    )
    trajectories = batch(agent.policy.tokenizer)
    watch = LargestVocabularyTensor(agent.policy.model.config.vocab_size)
    with watch:
        update(agent, trajectories)
    total_response_tokens = sum(len(t.response_ids) for t in trajectories)
    assert 0 < watch.rows <= chunk < total_response_tokens


def test_the_update_kl_equals_a_slow_reference_with_a_model_copy(raw_tiny_model):
    agent = learner(raw_tiny_model, logit_chunk_tokens=3)
    start = copy.deepcopy(agent.policy.model)
    trajectories = batch(agent.policy.tokenizer)
    result, _ = update(agent, trajectories)
    padded = pad_batch(trajectories, agent.policy.pad_token_id)
    seq_kls = []
    with torch.no_grad():
        for i, t in enumerate(trajectories):
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            s, n = len(t.prompt_ids), len(t.response_ids)
            theta = agent.policy.model(input_ids=ids).logits[:, s - 1 : s - 1 + n]
            cur = start(input_ids=ids).logits[:, s - 1 : s - 1 + n]
            per_token = kl_exact(theta, cur, agent.spec.temperature)
            seq_kls.append(sequence_kl(per_token, padded.response_mask[i : i + 1, :n]))
    region = agent.spec.trust_region
    expected = kl_quantile(torch.cat(seq_kls), region.alpha)
    assert expected > 0
    assert result.kl_quantile == pytest.approx(expected, rel=1e-4, abs=1e-7)


def test_token_budget_micro_batches_respect_the_budget_and_give_the_same_step(raw_tiny_model):
    """The budget counts a micro-batch's trajectories' tokens (the model packs them)."""
    trajectories = batch(learner(raw_tiny_model).policy.tokenizer, n=7)
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in trajectories]
    budget = 2 * max(lengths)
    steps, parts = [], []
    for limit in (None, budget):
        agent = learner(
            raw_tiny_model,
            micro_batch_size=8,
            max_tokens_per_micro_batch=limit,
            trust_region=TrustRegionSpec(kl_estimator="k3"),
        )
        agent.policy.optimizer = torch.optim.SGD(agent.policy.model.parameters(), lr=0.1)
        parts.append([rows for rows, _ in agent.policy.micro_batches(trajectories)])
        initial = agent.weights()
        update(agent, trajectories)
        steps.append(torch.cat([(v - initial[k]).flatten() for k, v in agent.weights().items()]))
    assert len(parts[0]) == 1 and len(parts[1]) > 1
    assert all(sum(lengths[r] for r in rows) <= budget for rows in parts[1])
    assert (steps[0] - steps[1]).norm() / steps[0].norm() < 1e-4


def test_a_planned_token_budget_caps_micro_batches_on_a_gpu_only(raw_tiny_model):
    """By hand: 90 % of half of 100 bytes is 45; 45 - 10 fixed leaves 35, 11 tokens of 3. Where
    state and step (here 50) outgrow the 45, no micro-batch fits: 0. On the CPU nothing is
    capped (the plan is the GPU's)."""
    budget = TokenBudget(fixed=10, state=4, step=2, per_token=3, share=0.5, usable=0.9)
    assert budget.tokens(100) == 11
    assert dataclasses.replace(budget, step=46).tokens(100) == 0
    assert learner(raw_tiny_model, token_budget=budget).policy.max_tokens is None


# --- 4. gradient checkpointing -----------------------------------------------------------------


def saved_activation_bytes(agent, trajectories) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps for backward during one update, and the update's logp_hat."""
    saved = 0

    def pack(tensor):
        nonlocal saved
        saved += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result, _ = update(agent, trajectories)
    return saved, result.logp_hat


def test_gradient_checkpointing_changes_memory_not_results(raw_tiny_model):
    """Every layer, every second layer (0, 2, ...) and none: the same update, each stride
    keeping less for the backward than the sparser one."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    trajectories = batch(learner(raw_tiny_model).policy.tokenizer)
    plain_bytes, plain_logp = saved_activation_bytes(learner(raw_tiny_model), trajectories)
    saved = {}
    for every in (1, 2):
        agent = learner(raw_tiny_model, checkpoint_every=every)
        layers = [
            m for m in agent.policy.model.modules() if isinstance(m, GradientCheckpointingLayer)
        ]
        assert len(layers) >= 2
        assert [layer.gradient_checkpointing for layer in layers] == [
            index % every == 0 for index in range(len(layers))
        ]
        saved[every], logp = saved_activation_bytes(agent, trajectories)
        torch.testing.assert_close(logp, plain_logp, rtol=0, atol=1e-6)
    assert saved[1] < 0.7 * plain_bytes
    assert saved[1] < saved[2] < plain_bytes
