"""Per-stage outputs: metrics.jsonl, certificates.jsonl (design §8), the experiment trackers
(TensorBoard, MLflow, W&B: `trackers.py`), and the same numbers as Ray metrics, which reach the
Ray dashboard and its Prometheus endpoint."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.metrics import Gauge

from satseq.cluster.metric_keys import PHASE_PREFIX, agent_names, is_scalar
from satseq.cluster.trackers import Trackers
from satseq.config import RunConfig
from satseq.files import write_text_atomically

if TYPE_CHECKING:
    from satseq.storage import StorageMirror

# Per-stage key families whose last segment becomes a tag: `time/rollout` is
# satseq_phase_seconds{phase="rollout"}, so one dashboard query shows every phase.
TAGGED_FAMILIES = {
    PHASE_PREFIX.rstrip("/"): ("satseq_phase_seconds", "phase"),
    "sandbox": ("satseq_sandbox_executions", "status"),
    "faults": ("satseq_faults", "kind"),
}


class StageLog:
    """Appends one JSON object per stage; mirrors numeric metrics to the trackers of
    `output.trackers` and, inside a Ray worker or driver, to Ray metrics (`RayMetricsExporter`).

    On resume, lines for stages after the resumed checkpoint are dropped first, so the files
    hold each stage exactly once whatever happened to the previous process. With `storage`
    (`output.storage`) both files are uploaded after each stage's lines, before its checkpoint
    is marked complete there, and a resume on a node without them downloads them first.
    """

    def __init__(
        self,
        output_dir: Path,
        config: RunConfig,
        resume_after_stage: int | None = None,
        storage: StorageMirror | None = None,
    ):
        self.metrics_path = output_dir / "metrics.jsonl"
        self.certificates_path = output_dir / "certificates.jsonl"
        self.storage = storage
        for path in (self.metrics_path, self.certificates_path):
            if storage is not None and resume_after_stage is not None:
                storage.fetch(path)
            truncate_after_stage(path, resume_after_stage)
        self.trackers = Trackers(config, output_dir, resume=resume_after_stage is not None)
        self.ray_metrics = RayMetricsExporter(run=output_dir.name) if ray.is_initialized() else None

    def write(self, metrics: dict[str, Any], certificate: dict[str, Any]) -> None:
        append_json_line(self.metrics_path, metrics)
        append_json_line(self.certificates_path, certificate)
        if self.storage is not None:
            self.storage.upload(self.metrics_path)
            self.storage.upload(self.certificates_path)
        stage = int(metrics["stage"])
        scalars = {key: value for key, value in metrics.items() if is_scalar(value)}
        self.trackers.log_stage(stage, scalars)
        if self.ray_metrics is not None:
            self.ray_metrics.export(metrics)

    def close(self) -> None:
        self.trackers.close()


@dataclass(frozen=True)
class GaugePoint:
    """One value of one Ray gauge, e.g. satseq_agent_kl_quantile{agent="a0"} = 0.03."""

    name: str
    value: float
    tags: dict[str, str]
    source: str  # the metrics.jsonl key pattern, e.g. `kl_quantile/<agent>`


def gauge_points(metrics: dict[str, Any]) -> list[GaugePoint]:
    """Map one stage's metrics.jsonl record onto Ray gauges (all named `satseq_...`).

    - `<key>/<agent>` (agents are the names in `reward/mean/<agent>`): satseq_agent_<key>
      with tag `agent`, e.g. `kl_quantile/a0` → satseq_agent_kl_quantile{agent="a0"};
    - `time/<phase>` → satseq_phase_seconds{phase}, `sandbox/<status>` →
      satseq_sandbox_executions{status};
    - any other key → satseq_<key>, e.g. `certificate/bandit_lower_bound` →
      satseq_certificate_bandit_lower_bound; `stage` → satseq_stage.
    Non-numeric and non-finite values are left out (a gauge keeps its last finite value).
    """
    agents = set(agent_names(metrics))
    points = []
    for key, value in metrics.items():
        if not is_scalar(value):
            continue
        family, _, last = key.rpartition("/")
        if family and last in agents:
            points.append(
                GaugePoint(
                    f"satseq_agent_{metric_name(family)}",
                    value,
                    {"agent": last},
                    f"{family}/<agent>",
                )
            )
        elif family in TAGGED_FAMILIES:
            name, tag = TAGGED_FAMILIES[family]
            points.append(GaugePoint(name, value, {tag: last}, f"{family}/<{tag}>"))
        else:
            points.append(GaugePoint(f"satseq_{metric_name(key)}", value, {}, key))
    return points


def metric_name(key: str) -> str:
    """`certificate/bandit_lower_bound` → `certificate_bandit_lower_bound` (Prometheus charset)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


class RayMetricsExporter:
    """Sets one Ray Gauge per metric family after each stage, tagged with the run's name.

    Runs in the process that writes the stage (the coordinator actor); Ray's metrics agent on
    that node serves the values on its Prometheus port a few seconds later, as `ray_satseq_...`.
    """

    def __init__(self, run: str):
        self.run = run
        self.gauges: dict[str, Gauge] = {}

    def export(self, metrics: dict[str, Any]) -> None:
        for point in gauge_points(metrics):
            gauge = self.gauges.get(point.name)
            if gauge is None:
                gauge = Gauge(
                    point.name,
                    description=f"satseq: {point.source} of metrics.jsonl, set once per stage",
                    tag_keys=("run", *point.tags),
                )
                self.gauges[point.name] = gauge
            tags = {"run": self.run, **point.tags}
            gauge.set(point.value, tags={key: ascii_tag(value) for key, value in tags.items()})


def ascii_tag(value: str) -> str:
    """A tag value Ray's metrics accept (ASCII only): `λ_run` → `\\u03bb_run`."""
    return value.encode("ascii", "backslashreplace").decode("ascii")


def append_json_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()


def truncate_after_stage(path: Path, stage: int | None) -> None:
    """Keep only the lines of stages ≤ `stage` (None: start the file afresh)."""
    if stage is None or not path.exists():
        path.unlink(missing_ok=True)
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash mid-append
            continue
        if record["stage"] <= stage:
            kept.append(line)
    write_text_atomically(path, "".join(line + "\n" for line in kept))  # a crash keeps the old
