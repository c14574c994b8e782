"""With a bf16 compute dtype, each float32 master weight is cast to bf16 once per optimiser
step and once per pass without gradients, however many micro-batches the step takes and with
gradient checkpointing's recomputation too (`AgentPolicy.cast_once`): before it, autocast cast
every weight again in each micro-batch's forward and each recompute (3.1 casts of each weight a
step at 4 micro-batches, 6.2 with checkpointing). The casts are the same tensors either way,
so the update is the same bit for bit."""

import contextlib
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from satseq.actors.learner import update
from satseq.actors.learner.policy import AgentPolicy
from tests.actors.test_learner import make_learner, trajectories

A = torch.tensor([1.0, -0.5, 0.3, -1.0])


class WeightCasts(TorchDispatchMode):
    """Counts the dtype casts (`aten._to_copy`) of each of `weights`' storages."""

    def __init__(self, weights: list[torch.Tensor]):
        super().__init__()
        self.storages = {w.untyped_storage().data_ptr() for w in weights}
        self.casts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        source = args[0] if args else None
        if func is torch.ops.aten._to_copy.default and isinstance(source, torch.Tensor):
            storage = source.untyped_storage().data_ptr()
            if storage in self.storages:
                self.casts[storage] += 1
        return func(*args, **(kwargs or {}))


def casts_per_weight(monkeypatch, model, micro_batch_size, checkpointing) -> dict[str, list]:
    """The most casts of any one weight, and how many weights were cast, per optimiser step
    and per KL check, in one bf16 update of two epochs (the penalty on)."""
    learner = make_learner(
        model,
        micro_batch_size=micro_batch_size,
        dtype="bfloat16",
        kl_coef=0.5,
        ppo_epochs=2,
        checkpoint_every=1 if checkpointing else None,
    )
    weights = learner.policy.trainable_parameters()
    batch = trajectories(learner.policy.tokenizer)
    logp_cur = learner.logprobs(batch)
    counted: dict[str, list] = {"optimizer_step": [], "kl_check": []}

    def counting(original, name):
        def counted_call(*args, **kwargs):
            with WeightCasts(weights) as casts:
                result = original(*args, **kwargs)
            counted[name].append((max(casts.casts.values()), len(casts.casts)))
            return result

        return counted_call

    with monkeypatch.context() as patch:
        for name in counted:
            patch.setattr(update, name, counting(getattr(update, name), name))
        learner.update(batch, logp_cur, A, torch.ones(4))
    return counted


@pytest.mark.parametrize("checkpointing", [False, True])
def test_each_weight_is_cast_once_a_step_however_many_micro_batches(
    monkeypatch, raw_tiny_model, checkpointing
):
    for micro_batch_size in (4, 1):  # one micro-batch a step, then four
        counted = casts_per_weight(monkeypatch, raw_tiny_model, micro_batch_size, checkpointing)
        assert counted["optimizer_step"] and counted["kl_check"]
        for most, weights in counted["optimizer_step"] + counted["kl_check"]:
            assert most == 1, counted  # no weight cast twice in a step or a check
            assert weights >= 20, counted  # the tiny model's Linear weights, cast


def test_casting_once_changes_nothing_the_update_computes(monkeypatch, raw_tiny_model):
    def one_update():
        learner = make_learner(raw_tiny_model, micro_batch_size=1, dtype="bfloat16", kl_coef=0.5)
        batch = trajectories(learner.policy.tokenizer)
        result = learner.update(batch, learner.logprobs(batch), A, torch.ones(4))
        return result, learner.weights()

    once, once_weights = one_update()
    monkeypatch.setattr(AgentPolicy, "cast_once", lambda self: contextlib.nullcontext())
    every_time, every_time_weights = one_update()
    assert torch.equal(once.logp_hat, every_time.logp_hat)
    assert once.kl_quantile == every_time.kl_quantile
    assert all(torch.equal(once_weights[k], every_time_weights[k]) for k in once_weights)
