"""A LoRA agent's learner (design §12): the base frozen, only the adapter trains; the
backtracking snapshot, the offload and the resume state cover the adapter only, and restore it
bit for bit; a checkpoint of another rank is refused naming both."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import get_peft_model_state_dict

from satseq.actors.learner import Learner, LearnerSpec, OptimizerSpec, TrustRegionSpec
from satseq.models.adapters import LoraSpec, initial_adapter
from tests.actors.test_learner import trajectories

A = torch.tensor([1.0, -1.0, 1.0, -1.0])


@pytest.fixture(scope="module")
def adapters(raw_tiny_model, tmp_path_factory):
    cache = tmp_path_factory.mktemp("adapters")
    return {
        rank: str(initial_adapter(raw_tiny_model, LoraSpec(rank, 2.0 * rank), 0, cache))
        for rank in (4, 8)
    }


def lora_learner(path, lr=1e-2, target_kl=10.0, **overrides):
    spec = LearnerSpec(
        model_path=path,
        agent_index=0,
        micro_batch_size=4,
        optimizer=OptimizerSpec(lr=lr),
        trust_region=TrustRegionSpec(target_kl=target_kl, max_backtracks=1),
        **overrides,
    )
    return Learner(spec)


def named(learner, trainable):
    return {
        name: param.detach().clone()
        for name, param in learner.policy.model.named_parameters()
        if param.requires_grad == trainable
    }


def test_only_the_adapter_trains_and_is_the_whole_training_state(adapters):
    learner = lora_learner(adapters[4])
    base, adapter = named(learner, False), named(learner, True)
    assert adapter and all("lora_" in name for name in adapter)
    assert all(t.dtype == torch.float32 for t in adapter.values())
    batch = trajectories(learner.policy.tokenizer)
    result = learner.update(batch, learner.logprobs(batch), A, torch.ones(4))
    assert result.accepted_steps == 1
    after = named(learner, False)
    assert all(torch.equal(after[name], base[name]) for name in base)  # the base never moves
    moved = named(learner, True)
    assert any(not torch.equal(moved[name], adapter[name]) for name in adapter)
    optimizer = learner.policy.optimizer
    stepped = {id(p) for p in optimizer.state}
    assert stepped == {id(p) for p in learner.policy.trainable_parameters()}  # AdamW: adapter
    assert set(learner.policy.snapshot.model) == set(adapter)  # the snapshot: adapter only
    weights = learner.weights()  # what engines get: the adapter, PEFT-named
    expected = get_peft_model_state_dict(learner.policy.adapter)
    assert set(weights) == set(expected)
    assert all(torch.equal(weights[name], tensor) for name, tensor in expected.items())
    assert sum(t.numel() for t in weights.values()) == sum(t.numel() for t in adapter.values())


def test_a_rejected_step_restores_the_adapter_bit_for_bit(adapters):
    learner = lora_learner(adapters[4], lr=1.0, target_kl=1e-9)  # every attempt overshoots
    batch = trajectories(learner.policy.tokenizer)
    logp_cur = learner.logprobs(batch)
    before = named(learner, True)
    result = learner.update(batch, logp_cur, A, torch.ones(4))
    assert result.accepted_steps == 0 and result.backtracks == 1
    after = named(learner, True)
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert torch.equal(learner.logprobs(batch), logp_cur)


def test_resume_restores_the_adapter_optimizer_and_rng_bit_for_bit(adapters, tmp_path):
    batch = trajectories(lora_learner(adapters[4]).policy.tokenizer)
    first = lora_learner(adapters[4])
    first.update(batch, first.logprobs(batch), A, torch.ones(4))
    path = first.save_state(str(tmp_path / "learner.pt"))
    saved = torch.load(path, weights_only=False)
    assert saved["lora_rank"] == 4
    assert set(saved["model"]) == set(named(first, True))  # no base weight in the file
    first.update(batch, None, A, torch.ones(4))  # the uninterrupted run's next update
    resumed = lora_learner(adapters[4])
    resumed.load_state(path)
    resumed.update(batch, None, A, torch.ones(4))
    expected, got = named(first, True), named(resumed, True)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    assert torch.equal(resumed.logprobs(batch), first.logprobs(batch))


def test_a_checkpoint_of_another_rank_is_refused_naming_both(adapters, raw_tiny_model, tmp_path):
    path = lora_learner(adapters[4]).save_state(str(tmp_path / "rank4.pt"))
    with pytest.raises(ValueError, match=r"adapter of rank 4.*adapter of rank 8"):
        lora_learner(adapters[8]).load_state(path)
    with pytest.raises(ValueError, match=r"adapter of rank 4.*a full model"):
        lora_learner(raw_tiny_model).load_state(path)


def test_an_offloaded_lora_learner_moves_its_adapter_only(adapters):
    learner = lora_learner(adapters[4], offload="idle_agents")
    batch = trajectories(learner.policy.tokenizer)
    learner.update(batch, learner.logprobs(batch), A, torch.ones(4))
    stats = learner.policy.residency.stats
    adapter_bytes = sum(t.nbytes for t in named(learner, True).values())
    adam_bytes = sum(
        t.nbytes for state in learner.policy.optimizer.state.values() for t in state.values()
    )
    assert stats.offloads == 2 and stats.onloads == 1
    # at start the adapter's masters; after the update, the masters and their AdamW state
    assert stats.bytes_offloaded == 2 * adapter_bytes + adam_bytes
    assert adam_bytes > 2 * adapter_bytes  # both moments (and the step counts)


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file (or [heap], ...) whose memory map holds `tensor`'s storage."""
    address = tensor.untyped_storage().data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if low <= address < high:
            return fields[5] if len(fields) > 5 else None
    return None


def test_learners_on_one_base_read_it_from_its_file_so_a_node_holds_it_once(
    adapters, raw_tiny_model
):
    """The frozen base is a read-only map of the base's safetensors file (never written, so
    never copied): every learner on that base, in any process of the node, reads the same
    pages of the page cache."""
    learners = [lora_learner(adapters[4]), lora_learner(adapters[8])]
    batch = trajectories(learners[0].policy.tokenizer)
    learners[0].update(batch, learners[0].logprobs(batch), A, torch.ones(4))
    base_file = str(Path(raw_tiny_model).resolve() / "model.safetensors")
    for learner in learners:
        frozen = [p for p in learner.policy.model.parameters() if not p.requires_grad]
        assert frozen and all(mapped_file(p) == base_file for p in frozen)
        assert all(mapped_file(p) != base_file for p in learner.policy.trainable_parameters())


HEAP_PEAK = """
import psutil, torch
from satseq.actors.residency import return_free_host_memory
process = psutil.Process()
before = process.memory_info().rss
blocks = [torch.ones(25_000) for _ in range(4000)]  # 400 MB in 100 KB heap blocks
del blocks
freed = process.memory_info().rss - before
return_free_host_memory()
print(freed, process.memory_info().rss - before)
"""


def test_the_host_memory_of_an_updates_transient_tensors_goes_back_to_the_system():
    """Freed tensors stay in glibc's heaps, resident, until trimmed: without it an idle
    learner keeps its last update's peak. In a fresh process, whose heap holds nothing yet."""
    result = subprocess.run([sys.executable, "-c", HEAP_PEAK], capture_output=True, text=True)
    freed, trimmed = (int(value) for value in result.stdout.split())
    assert freed > 300e6 and trimmed < 50e6
