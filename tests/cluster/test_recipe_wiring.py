"""One stage of each recipe on the in-process runtime (plain learners and a rollout worker, no
Ray): which agent updates when, which tokens the IS weights cover, which weights get pushed."""

import math
from dataclasses import replace

import pytest
import torch

from satseq.actors.learner import UpdateResult
from satseq.actors.trajectory import SamplingSpec
from satseq.algo.masks import owner_mask
from satseq.cluster.recipes import RECIPES
from satseq.cluster.recipes.stage_metrics import update_metrics
from satseq.cluster.runtime import TeamRuntime
from satseq.cluster.team import start_in_process
from satseq.config import QUICKSTART, load_config

RECORDED = ("update", "update_all", "logprobs")


class RecordingRuntime:
    """The in-process runtime, with a log of the calls a recipe makes: (name, args, result);
    a weight push (`weight_sync.push`) is logged as "push_weights"."""

    def __init__(self, runtime: TeamRuntime):
        self.runtime = runtime
        self.calls: list[tuple[str, tuple, object]] = []
        push = runtime.weight_sync.push
        runtime.weight_sync.push = lambda i: self.calls.append(("push_weights", (i,), push(i)))

    def __getattr__(self, name):
        attribute = getattr(self.runtime, name)
        if name not in RECORDED:
            return attribute

        def recorded(*args):
            result = attribute(*args)
            self.calls.append((name, args, result))
            return result

        return recorded

    def called(self, *names) -> list[tuple[str, tuple, object]]:
        return [call for call in self.calls if call[0] in names]


@pytest.fixture(scope="module")
def quickstart_model(builtin_models):
    """A model of the quickstart team: warm-started on its task, so rewards vary within a group
    and updates move it."""
    return load_config(QUICKSTART).team.agents[0].path


def one_stage(model_path, algorithm, n_agents, *overrides):
    agents = ", ".join(f"{{name: a{i}, path: '{model_path}'}}" for i in range(n_agents))
    config = load_config(
        QUICKSTART,
        [
            f"algorithm.name={algorithm}",
            f"team.agents=[{agents}]",
            "trainer.batch_size=8",
            "sat_seq.group_size=4",
            "grpo.group_size=2",
            "rollout.max_new_tokens=24",
            "trainer.ppo_epochs=1",
            "trainer.lr=1e-2",  # a visible step
            "algorithm.kl_ctrl.target_kl=100.0",  # every step accepted
            "data.synthetic.n_train=16",
            *overrides,
        ],
    )
    recipe_class = RECIPES[algorithm]
    runtime = RecordingRuntime(start_in_process(config, recipe_class.learner_settings(config)))
    recipe = recipe_class(config, runtime, _problems(config))
    result = recipe.run_stage(0)
    return runtime, recipe, result


def _problems(config):
    from satseq.cluster.training_data import training_problems

    return training_problems(config)


def assert_engines_hold_the_learners_weights(runtime: RecordingRuntime):
    (worker,) = runtime.team.rollouts
    for name, learner in zip(runtime.team.agents, runtime.team.learners, strict=True):
        engine_weights = worker.engines[name].model.state_dict()
        for key, tensor in learner.weights().items():
            assert torch.equal(engine_weights[key], tensor), f"{name}: {key} was not pushed"


def expected_is_weights(batch, logp_cur, logp_new, updated, max_log_ratio):
    """c by the definition (design §4), one trajectory and one token at a time."""
    c = []
    for r in range(len(batch.trajectories)):
        log_ratio = sum(
            float(logp_new[r, t] - logp_cur[r, t])
            for t in range(batch.owner_ids.shape[1])
            if batch.response_mask[r, t] > 0 and int(batch.owner_ids[r, t]) in updated
        )
        clamped = max(-max_log_ratio, min(max_log_ratio, log_ratio))
        c.append(min(1.0, math.exp(clamped)))
    return torch.tensor(c)


def expected_correction(batch, logp_cur, cap, level):
    """The rollout correction by hand: π_cur/π_behaviour of each model-written token (every
    owner's), or of each row's product, truncated at `cap`; [N, T] (1 off the tokens) or [N]."""
    N, T = batch.response_mask.shape
    tokens = [
        [(r, t) for t in range(T) if batch.response_mask[r, t] > 0 and batch.owner_ids[r, t] >= 0]
        for r in range(N)
    ]
    if level == "sequence":
        log_w = [sum(float(logp_cur[r, t] - batch.behaviour_logprobs[r, t]) for r, t in row)
                 for row in tokens]  # fmt: skip
        return torch.tensor([min(cap, math.exp(x)) for x in log_w])
    w = torch.ones(N, T)
    for row in tokens:
        for r, t in row:
            w[r, t] = min(cap, math.exp(float(logp_cur[r, t] - batch.behaviour_logprobs[r, t])))
    return w


@pytest.mark.parametrize("topology", ["mixture", "chain"])
def test_sat_seq_updates_in_order_and_pushes_each_agent_before_the_next(quickstart_model, topology):
    runtime, _, result = one_stage(
        quickstart_model, "sat_seq", 3, "sat_seq.scheduler=static", f"team.topology={topology}"
    )
    steps = [(name, args[0]) for name, args, _ in runtime.called("update", "push_weights")]
    assert steps == [
        ("update", 0),
        ("push_weights", 0),
        ("update", 1),
        ("push_weights", 1),
        ("update", 2),
        ("push_weights", 2),
    ]
    assert_engines_hold_the_learners_weights(runtime)
    assert result.metrics["accepted/a0"] == 1
    assert set(result.certificate["agents"]) == {"a0", "a1", "a2"}


@pytest.mark.parametrize("topology", ["mixture", "chain"])
def test_sat_seq_is_weights_cover_exactly_the_tokens_of_agents_updated_before(
    quickstart_model, topology
):
    runtime, recipe, _ = one_stage(
        quickstart_model, "sat_seq", 2, "sat_seq.scheduler=static", f"team.topology={topology}"
    )
    (first, second) = runtime.called("update")
    _, (i0, batch, rows0, logp_cur, _, c0, _), _ = first
    _, (i1, _, rows1, _, _, c1, _), _ = second
    assert (i0, i1) == (0, 1)
    # every agent now holds its updated weights (each was updated once)
    logp_new = runtime.runtime.logprobs(batch)
    max_log_ratio = recipe.config.sat_seq.max_log_ratio
    # nobody was updated before agent 0: c is the rollout correction of each trajectory alone
    w = expected_correction(batch, logp_cur, 2.0, "sequence")
    torch.testing.assert_close(c0, w, atol=1e-6, rtol=1e-6)
    train = range(batch.n_train)  # held-out rows never enter an update
    expected = w * expected_is_weights(batch, logp_cur, logp_new, {0}, max_log_ratio)
    torch.testing.assert_close(c1[train], expected[train], atol=1e-5, rtol=1e-5)
    if topology == "mixture":  # one writer per trajectory: agent 1's own rows carry c = w
        own0 = owner_mask(batch.owner_ids, [0], batch.response_mask)
        assert not torch.allclose(logp_new * own0, logp_cur * own0)  # agent 0 moved
        torch.testing.assert_close(c1[rows1], w[rows1])
        assert (c1[rows0] < w[rows0] - 1e-3).any()
    else:  # every chain holds agent 0's turn: every trajectory is reweighted by its moves
        assert rows0 == rows1 == list(train)


def test_grpo_updates_every_agent_at_once_on_its_own_groups(quickstart_model):
    runtime, _, result = one_stage(quickstart_model, "grpo", 2)
    ((_, (batch, rows, _, _, c), _),) = runtime.called("update_all")
    for agent, agent_rows in enumerate(rows):
        assert agent_rows and all(
            set(batch.trajectories[r].owner_ids) == {agent} for r in agent_rows
        )
    # no IS weights between agents: c is each token's rollout correction, π_cur/π_behaviour
    ((_, (logp_batch,), logp_cur),) = runtime.called("logprobs")
    assert logp_batch is batch
    torch.testing.assert_close(c, expected_correction(batch, logp_cur, 2.0, "token"))
    assert_engines_hold_the_learners_weights(runtime)
    assert result.metrics["accepted/a1"] == 1
    # with the correction off, on-policy GRPO takes logp_cur from each learner's first pass
    runtime, _, _ = one_stage(quickstart_model, "grpo", 2, "rollout.correction.mode=off")
    ((_, (_, _, logp_cur, _, c), _),) = runtime.called("update_all")
    assert logp_cur is None and torch.equal(c, torch.ones_like(c))
    assert not runtime.called("logprobs")


def test_spo_updates_the_trackers_of_the_drawn_prompts_after_the_step(quickstart_model):
    runtime, recipe, result = one_stage(quickstart_model, "spo", 2)
    ((_, (batch, rows, _, A, _), _),) = runtime.called("update_all")
    assert [len(agent_rows) for agent_rows in rows] == [8, 8]  # B prompts each, one sample each
    for agent, agent_rows in enumerate(rows):
        assert all(set(batch.trajectories[r].owner_ids) == {agent} for r in agent_rows)
        torch.testing.assert_close(float(A[agent_rows].mean()), 0.0, atol=1e-6, rtol=0)
    assert_engines_hold_the_learners_weights(runtime)
    visited = [key for key in recipe.problem_of if recipe.tracker.last_response(key) is not None]
    assert len(visited) == 16  # 8 prompts per agent, each with its response stored
    assert result.metrics["spo/rho_mean"] == pytest.approx(recipe.config.spo.rho_max)


@pytest.mark.parametrize(
    "offload", ["trainer.offload=idle_agents", "team.agents.1.offload=idle_agents"]
)
def test_colocated_engines_sleep_while_learners_work_and_take_pushed_weights_on_waking(
    quickstart_model, offload
):
    """One agent that offloads is enough: its learner shares the engines' device (the engines
    once stayed awake unless trainer.offload said so, while placement and the checks counted
    the agent's own setting)."""
    runtime, _, result = one_stage(
        quickstart_model, "sat_seq", 2, "sat_seq.scheduler=static", offload
    )
    (worker,) = runtime.team.rollouts
    # the stage ended on learner calls: the engines sleep, holding every pushed update for later
    assert worker.asleep and sorted(worker.pending_weights) == ["a0", "a1"]
    # an offloading learner: offloaded at start and after its update
    for learner in runtime.team.learners:
        if learner.spec.offload == "none":
            continue
        stats = learner.policy.residency.stats
        assert not learner.policy.residency.resident and (stats.offloads, stats.onloads) == (2, 1)
    assert "memory/peak_gib/a0" not in result.metrics  # the CPU reports no peak
    runtime.generate([], SamplingSpec())
    assert not worker.asleep
    assert_engines_hold_the_learners_weights(runtime)


def test_one_agent_that_offloads_puts_the_vllm_engines_to_sleep_on_a_gpu():
    from satseq.launch.settings import engine_options

    gpu = ["rollout.engine=vllm", "rollout.resources.num_gpus=0.5"]
    assert "enable_sleep_mode" not in engine_options(load_config(QUICKSTART, gpu))
    config = load_config(QUICKSTART, [*gpu, "team.agents.2.offload=idle_agents"])
    assert config.plan.engines_share_devices and engine_options(config)["enable_sleep_mode"]


def test_the_update_metrics_carry_the_peak_device_memory_and_padding_where_there_are_some():
    stats = UpdateResult(torch.zeros(1, 1, device="cpu"), [], 0.0, 0.0, 1, 1.0)
    assert not {"memory/peak_gib", "batch/padding_fraction"} & set(update_metrics(stats))
    assert update_metrics(replace(stats, peak_memory_gib=2.5))["memory/peak_gib"] == 2.5
    assert update_metrics(replace(stats, padding_fraction=0.25))["batch/padding_fraction"] == 0.25


def test_an_agent_baseline_centres_each_agents_advantages_on_its_own_samples(quickstart_model):
    """`sat_seq.baseline: agent`: in every prompt's group, an agent's advantages over its own
    samples average 0 (weighted by c); the team's baseline (the default) mixes the agents'
    samples, so an agent's own need not average 0 (here: two right answers beside another
    agent's wrong one get A = 0.58 each under the team's, 0 under their own)."""
    advantages = {}
    for baseline in ("team", "agent"):
        runtime, _, _ = one_stage(
            quickstart_model,
            "sat_seq",
            2,
            "sat_seq.scheduler=static",
            f"sat_seq.baseline={baseline}",
        )
        for _, (i, batch, rows, _, A, c, _), _ in runtime.called("update"):
            advantages[baseline, i] = {r: float(A[r]) for r in rows}
            if baseline == "agent":
                for group in range(batch.n_train // 4):  # G = 4
                    own = [r for r in rows if r // 4 == group]
                    weights = c[own] / c[own].sum()
                    assert abs(float((weights * A[own]).sum())) < 1e-5
    moved = [
        abs(advantages["team", i][r] - advantages["agent", i][r])
        for i in (0, 1)
        for r in advantages["team", i]
    ]
    assert max(moved) > 0.1
