"""Per-stage outputs: metrics.jsonl, certificates.jsonl and TensorBoard events (DESIGN §8)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


class StageLog:
    """Appends one JSON object per stage; mirrors numeric metrics to TensorBoard.

    On resume, lines for stages after the resumed checkpoint are dropped first, so the files
    hold each stage exactly once whatever happened to the previous process.
    """

    def __init__(self, output_dir: Path, tensorboard: bool, resume_after_stage: int | None = None):
        self.metrics_path = output_dir / "metrics.jsonl"
        self.certificates_path = output_dir / "certificates.jsonl"
        for path in (self.metrics_path, self.certificates_path):
            truncate_after_stage(path, resume_after_stage)
        self.tensorboard = SummaryWriter(str(output_dir / "tensorboard")) if tensorboard else None

    def write(self, metrics: dict[str, Any], certificate: dict[str, Any]) -> None:
        append_json_line(self.metrics_path, metrics)
        append_json_line(self.certificates_path, certificate)
        if self.tensorboard is not None:
            stage = int(metrics["stage"])
            for key, value in metrics.items():
                if (
                    isinstance(value, int | float)
                    and not isinstance(value, bool)
                    and math.isfinite(value)
                ):
                    self.tensorboard.add_scalar(key, value, stage)
            self.tensorboard.flush()

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


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
    path.write_text("".join(line + "\n" for line in kept))
