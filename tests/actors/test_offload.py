"""A team on one accelerator ([2.9]): a learner that keeps its master weights and AdamW state in
host memory between updates computes exactly what a resident one computes, and the rollout
engines sleep while the learners train. On the CPU every move is a no-op `.to("cpu")`, run and
counted all the same."""

import pytest
import torch

from satseq.actors.rollout import RolloutWorker
from satseq.actors.trajectory import GenerationRequest, SamplingSpec
from tests.actors.tensor_guards import NamedDevices
from tests.actors.test_learner import make_learner, trajectories


def parameter_bytes(learner) -> int:
    return sum(p.numel() * 4 for p in learner.policy.model.parameters())  # float32 masters


def update(learner, batch, A=(1.0, -1.0, 1.0, -1.0)):
    return learner.update(batch, learner.logprobs(batch), torch.tensor(A), torch.ones(len(A)))


def optimizer_state(learner) -> list[torch.Tensor]:
    return [
        value
        for state in learner.policy.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("target_kl", [10.0, 1e-4], ids=["accepted", "backtracking"])
def test_an_offloaded_learner_computes_what_a_resident_one_computes(
    raw_tiny_model, dtype, target_kl
):
    def run(offload):
        learner = make_learner(
            raw_tiny_model, target_kl=target_kl, ppo_epochs=2, dtype=dtype, offload=offload
        )
        batch = trajectories(learner.policy.tokenizer)
        logprobs, results = [], []
        for A in ([1.0, -1.0, 0.5, -0.5], [-0.5, 1.0, -1.0, 0.5]):
            logprobs.append(learner.logprobs(batch))  # offloaded: the device copies only
            results.append(learner.update(batch, logprobs[-1], torch.tensor(A), torch.ones(4)))
        logprobs.append(learner.logprobs(batch))
        return learner, logprobs, results

    resident, resident_logprobs, resident_results = run("none")
    offloaded, offloaded_logprobs, offloaded_results = run("idle_agents")

    for a, b in zip(resident_logprobs, offloaded_logprobs, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(resident_results, offloaded_results, strict=True):
        assert torch.equal(a.logp_hat, b.logp_hat)
        assert (a.loss, a.kl_quantile, a.backtracks) == (b.loss, b.kl_quantile, b.backtracks)
    assert offloaded.region.beta == resident.region.beta
    for name, tensor in resident.weights().items():
        assert torch.equal(offloaded.weights()[name], tensor), name
    for a, b in zip(optimizer_state(resident), optimizer_state(offloaded), strict=True):
        assert torch.equal(a, b)
    # offloaded once at start and after each update, back on the device for each update
    assert (
        offloaded.policy.residency.stats.offloads,
        offloaded.policy.residency.stats.onloads,
    ) == (3, 2)
    assert resident.policy.residency.stats.offloads == resident.policy.residency.stats.onloads == 0


def test_offloaded_state_is_in_host_memory_and_every_byte_is_counted(raw_tiny_model):
    learner = make_learner(raw_tiny_model, dtype="bfloat16", offload="idle_agents")
    stats = learner.policy.residency.stats
    batch = trajectories(learner.policy.tokenizer)
    P = parameter_bytes(learner)
    assert (stats.offloads, stats.bytes_offloaded) == (1, P)  # at start: no AdamW state yet

    guard = NamedDevices()
    with guard:
        update(learner, batch)
    assert guard.violations == []
    S = sum(value.nbytes for value in optimizer_state(learner))  # exp_avg, exp_avg_sq, step
    assert S > 2 * P  # two moments per parameter
    assert (stats.onloads, stats.bytes_onloaded) == (1, P)
    assert stats.bytes_offloaded == P + (P + S)
    assert all(value.device.type == "cpu" for value in optimizer_state(learner))
    masters = learner.policy.model.state_dict()
    assert all(m.device.type == "cpu" and m.dtype == torch.float32 for m in masters.values())
    assert all(p.grad is None for p in learner.policy.model.parameters())
    # idle, the weights are the float32 masters in host memory; a forward pass gets, for its
    # span, what it reads: Linear weights in the compute dtype (autocast casts them anyway),
    # the tied embedding and the norms in float32
    embedding = learner.policy.model.get_input_embeddings().weight
    q_proj = learner.policy.model.model.layers[0].self_attn.q_proj.weight
    assert embedding.dtype == q_proj.dtype == torch.float32
    with learner.policy.residency.forward_weights():
        assert embedding.dtype == torch.float32 and q_proj.dtype == torch.bfloat16
    assert q_proj.dtype == torch.float32
    learner.logprobs(batch)
    assert stats.forward_copies == 3  # update()'s log-probs, the block above, this one

    update(learner, batch)
    assert (stats.onloads, stats.bytes_onloaded) == (2, P + (P + S))
    assert stats.seconds > 0


def test_on_the_cpu_float32_offloading_copies_nothing(raw_tiny_model):
    learner = make_learner(raw_tiny_model, offload="idle_agents")
    masters = {name: p.data_ptr() for name, p in learner.policy.model.named_parameters()}
    with learner.policy.residency.forward_weights():
        assert {
            name: p.data_ptr() for name, p in learner.policy.model.named_parameters()
        } == masters
    update(learner, trajectories(learner.policy.tokenizer))
    assert {name: p.data_ptr() for name, p in learner.policy.model.named_parameters()} == masters


def test_a_learner_resumes_offloaded_with_float32_optimizer_state(raw_tiny_model, tmp_path):
    source = make_learner(raw_tiny_model, dtype="bfloat16")
    batch = trajectories(source.policy.tokenizer)
    update(source, batch)
    restored = make_learner(raw_tiny_model, dtype="bfloat16", offload="idle_agents")
    restored.load_state(source.save_state(str(tmp_path / "learner.pt")))
    assert not restored.policy.residency.resident
    assert all(value.dtype == torch.float32 for value in optimizer_state(restored))
    for name, tensor in source.state.state_dict()["model"].items():
        assert torch.equal(restored.state.state_dict()["model"][name], tensor), name


def test_a_sleeping_worker_takes_pushed_weights_when_it_wakes(raw_tiny_model):
    worker = RolloutWorker({"a": raw_tiny_model}, engine="hf")
    learner = make_learner(raw_tiny_model, offload="idle_agents")
    batch = trajectories(learner.policy.tokenizer)
    update(learner, batch)
    before = {k: v.clone() for k, v in worker.engines["a"].model.state_dict().items()}

    assert worker.sleep() == {"a": "noop:hf"}
    worker.load_weights("a", learner.weights())
    assert all(torch.equal(before[k], v) for k, v in worker.engines["a"].model.state_dict().items())
    spec = SamplingSpec(max_new_tokens=2)
    with pytest.raises(RuntimeError, match="asleep"):
        worker.generate([GenerationRequest("a", [1, 2, 3], 1)], spec)

    assert worker.wake_up() == {"a": "noop:hf"}
    engine_weights = worker.engines["a"].model.state_dict()
    assert all(torch.equal(engine_weights[k], v) for k, v in learner.weights().items())
    assert worker.wake_up() == {}  # already awake
