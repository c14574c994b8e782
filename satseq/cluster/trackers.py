"""Experiment trackers (`output.trackers`): TensorBoard, MLflow and W&B each receive every numeric
key of a stage's metrics.jsonl line, with the stage as the step.

Each tracker is one small class with the `Tracker` interface; `StageLog` fans out to them. A run
in MLflow or W&B also holds the resolved config (parameters) and the run's outputs dir, and a
resumed run continues the tracker run it started: the ids are kept in `<output dir>/trackers.json`.

metrics.jsonl is the record; a tracker is a view of it. A tracker that cannot be opened or
reached is dropped with a warning and the run goes on without it (`Trackers`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from torch.utils.tensorboard import SummaryWriter

from satseq.config import RunConfig
from satseq.files import write_text_atomically

if TYPE_CHECKING:
    from mlflow.entities import Param

log = logging.getLogger(__name__)

RUN_IDS = "trackers.json"  # {tracker name: its run's id}, read on resume
# By default MLflow's HTTP client retries a dead server for about 4 minutes per call and
# wandb.init waits 90 s for one; a run should not wait that long for a view of metrics.jsonl
# (a user's own settings win: these environment variables, WANDB_INIT_TIMEOUT).
MLFLOW_HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
WANDB_INIT_TIMEOUT_S = 30.0


class Tracker(Protocol):
    name: str
    run_id: str | None  # what a resumed run passes back to continue the same tracker run

    def log_stage(self, stage: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Scalars in `<output dir>/tensorboard/`, for `tensorboard --logdir`."""

    name = "tensorboard"
    run_id = None  # a resumed run appends a new events file to the same directory

    def __init__(self, config: RunConfig, output_dir: Path, run_id: str | None):
        self.writer = SummaryWriter(str(output_dir / "tensorboard"))

    def log_stage(self, stage: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, stage)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    """An MLflow run in experiment `output.tracker_project`, on `output.mlflow_tracking_uri`
    (default: a SQLite store in `<output dir>/mlflow/`; MLflow 3 no longer opens plain-file
    stores unless told to)."""

    name = "mlflow"

    def __init__(self, config: RunConfig, output_dir: Path, run_id: str | None):
        from mlflow import MlflowClient  # seconds to import: only runs that use MLflow pay

        for variable, value in MLFLOW_HTTP_LIMITS.items():
            os.environ.setdefault(variable, value)
        uri = config.output.mlflow_tracking_uri
        artifact_location = None
        if uri is None:
            store = output_dir.resolve() / "mlflow"
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{store / 'mlflow.db'}"
            artifact_location = (store / "artifacts").as_uri()  # not the process's cwd
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            self.run_id = self._start_run(config, output_dir, artifact_location)
        else:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")

    def _start_run(self, config: RunConfig, output_dir: Path, artifact_location: str | None) -> str:
        project = config.output.tracker_project
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(project, artifact_location=artifact_location)
        )
        run = self.client.create_run(
            experiment_id,
            run_name=output_dir.name,
            tags={"output_dir": str(output_dir.resolve())},
        )
        self.client.log_batch(run.info.run_id, params=config_params(config))
        return run.info.run_id

    def log_stage(self, stage: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        metrics = [
            Metric(mlflow_metric_name(key), value, now_ms, stage) for key, value in scalars.items()
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    """A W&B run in project `output.tracker_project`, under `<output dir>/wandb/`. Without an
    API key (WANDB_API_KEY, `wandb login`) and without WANDB_MODE, it runs offline: upload it
    later with `wandb sync <output dir>/wandb/offline-run-*` (a resumed run's parts sync as one
    run)."""

    name = "wandb"

    def __init__(self, config: RunConfig, output_dir: Path, run_id: str | None):
        import wandb

        # WANDB_MODE, else an API key (WANDB_API_KEY, `wandb login`), decides; with neither the
        # run is offline. Here wandb.login only looks for a key: it asks and checks nothing.
        decided = bool(os.environ.get("WANDB_MODE")) or wandb.login(verify=False, prompt=False)
        self.run = wandb.init(
            project=config.output.tracker_project,
            name=output_dir.name,
            dir=output_dir,
            # W&B tags are labels of at most 64 characters: the outputs dir goes in the config
            config={**config.model_dump(mode="json"), "output_dir": str(output_dir.resolve())},
            id=run_id,
            resume="allow" if run_id else None,
            mode=None if decided else "offline",
            reinit="create_new",  # leaves any other run of this process alone
            settings=wandb.Settings(
                # Ray already keeps the process's stdout/stderr; capturing them twice helps no one
                console="off",
                init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", WANDB_INIT_TIMEOUT_S)),
            ),
        )
        self.run_id = self.run.id

    def log_stage(self, stage: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=stage)

    def close(self) -> None:
        self.run.finish()


TRACKERS: dict[str, Callable[[RunConfig, Path, str | None], Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}


class Trackers:
    """The trackers of `output.trackers`, fanned out to. On `resume`, each continues the run
    whose id `trackers.json` holds. One that cannot be opened, or raises later (a server gone, a
    full disk), is dropped with a warning, kept in `failed` for the driver to show: it costs the
    run one timeout, not one per stage."""

    def __init__(self, config: RunConfig, output_dir: Path, resume: bool):
        self.active: list[Tracker] = []
        self.failed: dict[str, str] = {}  # tracker name → the warning
        ids_path = output_dir / RUN_IDS
        if not resume:  # a fresh start never continues an earlier run's tracker runs
            ids_path.unlink(missing_ok=True)
        run_ids = json.loads(ids_path.read_text()) if ids_path.is_file() else {}
        for name in config.output.trackers:
            try:
                self.active.append(TRACKERS[name](config, output_dir, run_ids.get(name)))
            except Exception as error:  # nothing a tracker does may end the run
                self._warn(name, error)
        run_ids |= {tracker.name: tracker.run_id for tracker in self.active if tracker.run_id}
        if run_ids:
            write_text_atomically(ids_path, json.dumps(run_ids, indent=1) + "\n")

    def log_stage(self, stage: int, scalars: dict[str, float]) -> None:
        self._each(lambda tracker: tracker.log_stage(stage, scalars))

    def close(self) -> None:
        self._each(lambda tracker: tracker.close())

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.active):
            try:
                call(tracker)
            except Exception as error:  # nothing a tracker does may end the run
                self.active.remove(tracker)
                self._warn(tracker.name, error)

    def _warn(self, name: str, error: Exception) -> None:
        warning = (
            f"{name} tracker failed, the run goes on without it (metrics.jsonl has every "
            f"stage): {type(error).__name__}: {error}"
        )
        log.warning(warning)
        self.failed[name] = warning


def config_params(config: RunConfig) -> list[Param]:
    """The resolved config as MLflow parameters, keyed as `--set` keys them:
    `team.agents.0.path` = `builtin:tiny`, `trainer.lr` = `1e-05`."""
    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    flat = flatten(config.model_dump(mode="json"))
    return [Param(key, value[:MAX_PARAM_VAL_LENGTH]) for key, value in flat.items()]


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": [1, "x"]}, "c": None}` → `{"a.b.0": "1", "a.b.1": "x", "c": "null"}`."""
    if isinstance(tree, dict | list) and tree:
        children = tree.items() if isinstance(tree, dict) else enumerate(tree)
        return {
            key: value
            for part, child in children
            for key, value in flatten(child, f"{prefix}{part}.").items()
        }
    return {prefix.removesuffix("."): tree if isinstance(tree, str) else json.dumps(tree)}


def mlflow_metric_name(key: str) -> str:
    """MLflow allows letters, digits and `_-. :/` in a name: `val/pass@k` → `val/pass_at_k`, any
    other character → `_`."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))
