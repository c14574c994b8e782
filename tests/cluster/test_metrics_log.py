import json

from satseq.cluster.metrics import RayMetricsExporter, ascii_tag, truncate_after_stage


def test_resume_drops_later_stages_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"stage": s, "x": s}) for s in range(4)]
    path.write_text("\n".join(lines) + '\n{"stage": 4, "x"')  # the crash cut the last line
    truncate_after_stage(path, 1)
    assert [json.loads(line)["stage"] for line in path.read_text().splitlines()] == [0, 1]


def test_ray_gauges_take_runs_and_agents_with_non_ascii_names():
    """Ray's metric tags are ASCII only: a run dir or agent named `λ` must not end the run."""
    assert ascii_tag("λ_eq_0") == "\\u03bb_eq_0" and ascii_tag("run-1") == "run-1"
    exporter = RayMetricsExporter("λ_eq_0")
    exporter.export({"stage": 3, "reward/mean": 0.5, "reward/mean/α": 0.4, "kl_quantile/α": 0.1})
    assert {"satseq_reward_mean", "satseq_agent_kl_quantile"} <= set(exporter.gauges)
