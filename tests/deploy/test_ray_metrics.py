"""Training metrics reach Ray's Prometheus endpoint as `ray_satseq_*` gauges (satseq/cluster/
metrics.py), and the Grafana dashboard queries only gauges that exist."""

import json
import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from satseq.cluster.metrics import TAGGED_FAMILIES, gauge_points
from tests.cluster.runs import read_metrics
from tests.deploy.observed_run import REPO, STAGES

DASHBOARD = REPO / "deploy" / "grafana" / "satseq-training.json"
RAY_PREFIX = "ray_"  # Ray's Prometheus exporter prefixes every custom metric name
SATSEQ_TAGS = {"run", "agent", *(tag for _, tag in TAGGED_FAMILIES.values())}


def test_gauge_points_tag_agents_phases_and_sandbox_statuses():
    record = {
        "stage": 3,
        "reward/mean": 0.5,
        "reward/mean/a0": 0.25,
        "reward/mean/a1": 0.75,
        "kl_quantile/a0": 0.02,
        "beta/a1": 0.015,
        "time/rollout": 1.5,
        "sandbox/timeout": 2,
        "certificate/bandit_lower_bound": float("nan"),  # no held-out prompts: left out
        "note": "text",
    }
    points = {(p.name, tuple(p.tags.items())): p.value for p in gauge_points(record)}
    assert points == {
        ("satseq_stage", ()): 3,
        ("satseq_reward_mean", ()): 0.5,
        ("satseq_agent_reward_mean", (("agent", "a0"),)): 0.25,
        ("satseq_agent_reward_mean", (("agent", "a1"),)): 0.75,
        ("satseq_agent_kl_quantile", (("agent", "a0"),)): 0.02,
        ("satseq_agent_beta", (("agent", "a1"),)): 0.015,
        ("satseq_phase_seconds", (("phase", "rollout"),)): 1.5,
        ("satseq_sandbox_executions", (("status", "timeout"),)): 2,
    }


def scraped_samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(name, ((tag, value), ...)): value} of the satseq gauges, tags other than Ray's own."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(RAY_PREFIX + "satseq_"):
                tags = tuple(sorted((k, v) for k, v in sample.labels.items() if k in SATSEQ_TAGS))
                samples[sample.name.removeprefix(RAY_PREFIX), tags] = sample.value
    return samples


@pytest.mark.slow
def test_ray_metrics_export_the_last_stage_of_a_real_run(observed_run):
    scraped = scraped_samples(observed_run.ray_metrics)
    last = read_metrics(observed_run.output_dir)[-1]
    assert last["stage"] == STAGES - 1
    run = ("run", observed_run.output_dir.name)
    expected = {
        (p.name, tuple(sorted([run, *p.tags.items()]))): p.value for p in gauge_points(last)
    }
    # every number of the last metrics.jsonl record is on the endpoint, with its value
    assert set(expected) <= set(scraped)
    for key, value in expected.items():
        assert scraped[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key

    agents = ["solver_a", "solver_b", "solver_c"]
    for agent in agents:
        tags = tuple(sorted([("agent", agent), run]))
        assert 0.0 <= scraped["satseq_agent_reward_mean", tags] <= 1.0
        assert scraped["satseq_agent_kl_quantile", tags] >= 0.0
        assert scraped["satseq_agent_beta", tags] > 0.0
        assert scraped["satseq_agent_tokens_per_s", tags] > 0.0
        steps = scraped["satseq_agent_accepted", tags] + scraped["satseq_agent_rejected", tags]
        assert steps == 1  # trainer.ppo_epochs
        assert scraped["satseq_agent_backtracks", tags] >= 0
    phases = {
        dict(tags)["phase"]: v
        for (name, tags), v in scraped.items()
        if name == "satseq_phase_seconds"
    }
    assert {"rollout", "update"} <= set(phases)
    assert all(seconds > 0 for seconds in phases.values())
    assert math.isfinite(scraped["satseq_certificate_bandit_lower_bound", (run,)])


def dashboard_metric_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["definition"])
    return {name for expr in exprs for name in re.findall(r"\bray_(satseq_\w+)", expr)}


@pytest.mark.slow
def test_dashboard_queries_only_gauges_that_the_run_exports(observed_run):
    exported = {name for name, _ in scraped_samples(observed_run.ray_metrics)}
    # sandbox statuses appear only in tool-augmented runs
    possible = exported | {name for name, _ in TAGGED_FAMILIES.values()}
    queried = dashboard_metric_names()
    assert queried <= possible, queried - possible
    assert {"satseq_agent_kl_quantile", "satseq_phase_seconds"} <= queried


def test_dashboard_panels_have_unique_ids_and_prometheus_targets():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert all(t["expr"].startswith("ray_satseq_") for t in panel["targets"]), panel["title"]
