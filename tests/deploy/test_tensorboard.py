"""TensorBoard's own reader (what `tensorboard --logdir` runs) reads a real run's event files:
every numeric metrics.jsonl value is a scalar, tagged with its key, at its stage."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from satseq.cluster.metric_keys import is_scalar
from tests.cluster.runs import read_metrics

pytestmark = pytest.mark.slow


def test_tensorboard_reads_every_stage_metric_of_a_real_run(observed_run):
    events = EventAccumulator(str(observed_run.output_dir / "tensorboard"), size_guidance={})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"reward/mean", "kl_quantile/solver_a", "beta/solver_c", "time/rollout"} <= tags

    history = read_metrics(observed_run.output_dir)
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in history:
        for key, value in record.items():
            if is_scalar(value):
                expected.setdefault(key, []).append((record["stage"], value))
    assert set(expected) == tags
    for tag, points in expected.items():
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        assert [step for step, _ in logged] == [step for step, _ in points], tag
        assert [value for _, value in logged] == pytest.approx(
            [value for _, value in points], rel=1e-6
        ), tag
