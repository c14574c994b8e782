"""The backtracking snapshot keeps every weight and optimiser-state tensor in one arena,
allocated once per layout (on a GPU, one pinned allocation instead of one per tensor), and
restores them bit for bit."""

import pytest
import torch

from satseq.actors.learner.snapshot import ALIGNMENT, TrainingSnapshot


def a_model_and_its_adamw():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model[2].bias.requires_grad_(False)  # not trained: not in the snapshot
    trained = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(trained, lr=0.1)


def step(model, optimizer):
    optimizer.zero_grad()
    model(torch.randn(4, 5)).square().sum().backward()
    optimizer.step()


def test_one_arena_holds_every_tensor_and_is_reused_while_the_layout_stands():
    model, optimizer = a_model_and_its_adamw()
    snapshot = TrainingSnapshot().save(model, optimizer)  # before any step: weights only
    assert set(snapshot.model) == {"0.weight", "0.bias", "2.weight"}
    step(model, optimizer)
    snapshot.save(model, optimizer)  # AdamW's state appeared: laid out once more
    arena = snapshot._arena
    step(model, optimizer)
    snapshot.save(model, optimizer)
    assert snapshot._arena is arena  # the same allocation, step after step
    assert len(optimizer._optimizer_step_pre_hooks) == 1  # its step waits for the copies, once
    places = [*snapshot.model.values()] + [
        t for state in snapshot.optimizer["state"].values() for t in state.values()
    ]
    start, end = arena.data_ptr(), arena.data_ptr() + arena.nbytes
    assert len(places) == 3 + 3 * 3  # weights; exp_avg, exp_avg_sq and step of each
    assert all(start <= p.data_ptr() and p.data_ptr() + p.nbytes <= end for p in places)
    assert all((p.data_ptr() - start) % ALIGNMENT == 0 for p in places)
    assert snapshot.nbytes == arena.nbytes < 2 * sum(p.nbytes for p in places) + 12 * ALIGNMENT


@pytest.mark.parametrize("on_device", [False, True])
def test_restore_brings_back_the_weights_and_the_optimiser_state_bit_for_bit(on_device):
    """In host memory, and in an arena on the sources' device (a GPU's when they are on one;
    here the CPU, so the same memory: the host waits for nothing either way)."""
    model, optimizer = a_model_and_its_adamw()
    step(model, optimizer)
    snapshot = TrainingSnapshot(on_device=on_device).save(model, optimizer)
    assert snapshot._arena.device == next(model.parameters()).device
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {
        i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(optimizer.state.values())
    }
    for _ in range(2):
        step(model, optimizer)
    snapshot.restore(model, optimizer)
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())
    for i, restored in enumerate(optimizer.state.values()):
        assert all(torch.equal(restored[k], v) for k, v in state[i].items())


def test_the_optimisers_hook_does_not_keep_a_replaced_snapshot_or_its_arena_alive():
    import gc
    import weakref

    model, optimizer = a_model_and_its_adamw()
    gone = weakref.ref(TrainingSnapshot().save(model, optimizer))
    kept = TrainingSnapshot().save(model, optimizer)
    gc.collect()
    assert gone() is None  # its arena with it
    step(model, optimizer)  # the dead snapshot's hook is a no-op; the live one's waits
    kept.restore(model, optimizer)


def test_a_new_layout_drops_the_old_arena_before_allocating_its_own(monkeypatch):
    """The first save holds the weights; once AdamW's state appears the arena is laid out
    again: the old one is already unreferenced when the new one is allocated."""
    import weakref

    model, optimizer = a_model_and_its_adamw()
    snapshot = TrainingSnapshot().save(model, optimizer)
    old = weakref.ref(snapshot._arena)
    alive_when_allocating = []
    empty = torch.empty

    def watched_empty(*args, **kwargs):
        alive_when_allocating.append(old() is not None)
        return empty(*args, **kwargs)

    step(model, optimizer)
    monkeypatch.setattr(torch, "empty", watched_empty)
    snapshot.save(model, optimizer)
    assert alive_when_allocating == [False]
