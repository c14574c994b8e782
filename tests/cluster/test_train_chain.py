"""The chain topology end to end: every agent writes a turn of every trajectory and is trained."""

import subprocess

import pytest

from tests.cluster.runs import read_metrics, run_env, train_command

pytestmark = pytest.mark.slow


def test_chain_topology_trains_every_agent_on_its_own_turns(tmp_path, builtin_models):
    output_dir = tmp_path / "chain"
    subprocess.run(
        train_command(output_dir, 1, "--set", "team.topology=chain"),
        check=True,
        timeout=600,
        env=run_env(),
    )
    (metrics,) = read_metrics(output_dir)
    for agent in ("a0", "a1", "a2"):
        assert (
            metrics[f"accepted/{agent}"] + metrics[f"rejected/{agent}"] >= 1
        )  # it had tokens to train
        assert metrics[f"kl_quantile/{agent}"] > 0
    # three turns of up to 32 tokens each, plus two handoffs
    assert metrics["response_length/mean"] > 32
