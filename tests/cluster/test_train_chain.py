"""The chain topology end to end: every agent writes a turn of every trajectory and is trained."""

import os
import subprocess
import textwrap

import pytest

from tests.cluster.runs import read_metrics, run_env, train_command

pytestmark = pytest.mark.slow

# builtin:tiny was warm-started on single-turn answers: the last turn of a 3-turn chain is never
# right here, so on correctness alone every group is degenerate and nothing trains (a KL above 0
# was rounding). Half a point for opening a \boxed{} in the last turn, which about half the
# chains do, gives the groups a signal.
CHAIN_REWARDS = textwrap.dedent(
    """
    def opens_a_box(prompt, response, ground_truth, **meta):
        return float("\\\\boxed{" in response)
    """
)


def test_chain_topology_trains_every_agent_on_its_own_turns(tmp_path, builtin_models):
    (tmp_path / "chain_rewards.py").write_text(CHAIN_REWARDS)
    env = run_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    output_dir = tmp_path / "chain"
    rewards = "[{function: verify}, {function: 'chain_rewards:opens_a_box', weight: 0.5}]"
    subprocess.run(
        train_command(
            output_dir, 1, "--set", "team.topology=chain", "--set", f"reward.functions={rewards}"
        ),
        check=True,
        timeout=600,
        env=env,
    )
    (metrics,) = read_metrics(output_dir)
    assert metrics["groups/degenerate_fraction"] < 1  # some chains' rewards differ
    for agent in ("a0", "a1", "a2"):
        assert (
            metrics[f"accepted/{agent}"] + metrics[f"rejected/{agent}"] >= 1
        )  # it had tokens to train
        assert metrics[f"kl_quantile/{agent}"] > 1e-6  # its update moved it (rounding: ~1e-8)
    # three turns of up to 32 tokens each, plus two handoffs
    assert metrics["response_length/mean"] > 32
