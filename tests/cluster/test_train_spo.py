"""SPO and GRPO stages on the tiny model, the coordinator's whole stage loop in this process
(`start_in_process`): their metrics. On Ray they train in tests/offline/test_train_script.py
(SPO, `scripts/train.sh`) and tests/e2e/test_smollm2.py (GRPO, `configs/smollm2_grpo.yaml`)."""

from tests.cluster.runs import SPO_STAGES, read_metrics, short_quickstart, spo_run_args, train


def test_spo_runs_with_offline_priors_kl_forgetting_and_its_metrics(builtin_models, tmp_path):
    """Offline scores for 6 of the 8 prompts; the other 2 start at Beta(0.5, 0.5) and are
    counted."""
    train(short_quickstart(SPO_STAGES, *spo_run_args(tmp_path)), tmp_path / "run", SPO_STAGES)
    metrics = read_metrics(tmp_path / "run")
    assert [m["stage"] for m in metrics] == [0, 1, 2, 3]
    for m in metrics:
        assert m["spo/prompts_without_prior"] == 2
        assert 0.875 <= m["spo/rho_mean"] <= 0.96
        assert 0.0 < m["spo/p_hat_mean"] < 1.0
        assert 0.0 <= m["advantage/near_zero_fraction"] <= 1.0
        assert m["accepted/a0"] == m["accepted/a1"] == 2  # no trust region: every step taken
        assert "reward/team_vote" not in m  # agents answer different prompts under SPO
    # the prior for 3 of 4 successes is p̂ = (3 + 0.5) / (4 + 1) = 0.7, the empty one 0.5
    assert any(abs(m["spo/p_hat_mean"] - 0.5) > 1e-6 for m in metrics)
    # revisited prompts are re-scored after a policy step: ρ < ρ_max somewhere
    assert min(m["spo/rho_mean"] for m in metrics[1:]) < 0.96


def test_grpo_runs_with_group_metrics(builtin_models, tmp_path):
    config = short_quickstart(2, "--set", "algorithm.name=grpo", "--set", "grpo.group_size=4")
    train(config, tmp_path, 2)
    metrics = read_metrics(tmp_path)
    assert [m["stage"] for m in metrics] == [0, 1]
    for m in metrics:
        # 4 prompts × 3 agents = 12 groups, so the fraction is a multiple of 1/12
        assert (
            abs(m["groups/degenerate_fraction"] * 12 - round(m["groups/degenerate_fraction"] * 12))
            < 1e-9
        )
        # a degenerate group's G samples all get A = 0
        assert m["advantage/near_zero_fraction"] >= m["groups/degenerate_fraction"] - 1e-6
        assert 0.0 <= m["reward/team_vote"] <= 1.0
