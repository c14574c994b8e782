"""The experiment trackers of `output.trackers`, each read back with its own tool: MLflow's
`MlflowClient` against a real `mlflow server` on 127.0.0.1, W&B's offline run files through
`wandb leet inspect`. A `StageLog` on a temp dir writes the stages: no Ray, no training."""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from satseq.cluster.metric_keys import is_scalar
from satseq.cluster.metrics import StageLog
from satseq.cluster.trackers import mlflow_metric_name
from satseq.config import RunConfig
from tests.cluster.runs import STRAIGHT_STAGES, free_port, read_metrics

BIN = Path(sys.executable).parent
LAST = 2  # stages 0..LAST


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """A tracking server as a lab runs one, on a SQLite store; its URI."""
    store = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    command = [
        BIN / "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
        "--default-artifact-root", str(store / "artifacts"),
    ]  # fmt: skip
    # no job runner beside it (MLflow's GenAI jobs): one process fewer on a 2-core machine
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with (store / "server.log").open("w") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT, env=env)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # tens of seconds on a busy 2-core machine
    while not server_is_up(uri):
        assert server.poll() is None, (store / "server.log").read_text()
        assert time.monotonic() < deadline, "mlflow server did not answer /health"
        time.sleep(0.5)
    yield uri
    server.terminate()
    server.wait(timeout=60)


def server_is_up(uri: str) -> bool:
    try:
        return httpx.get(f"{uri}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def no_wandb_key(monkeypatch, tmp_path):
    """No W&B API key anywhere (environment, netrc, settings): the case of a lab without one."""
    for variable in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def run_config(**output) -> RunConfig:
    return RunConfig.model_validate(
        {"team": {"agents": [{"name": "a0", "path": "builtin:tiny"}]}, "output": output}
    )


def stage_metrics(stage: int) -> dict:
    """One metrics.jsonl line: numbers, and a string no tracker can plot."""
    return {
        "stage": stage,
        "reward/mean": 0.25 * stage,
        "reward/mean/a0": 0.5 - 0.125 * stage,
        "kl_quantile/a0": 0.01 * (stage + 1),
        "time/rollout": 1.5 + stage,
        "val/pass@k": 0.5 + 0.125 * stage,  # MLflow names allow no `@`
        "swap/a0": "builtin:tiny",
    }


def log_stages(output_dir: Path, config: RunConfig, stages, resume_after_stage=None) -> StageLog:
    """What the coordinator does: one StageLog for the process, a line per stage, then close."""
    log = StageLog(output_dir, config, resume_after_stage)
    for stage in stages:
        log.write(stage_metrics(stage), {"stage": stage, "bandit_lower_bound": None})
    log.close()
    return log


def jsonl_history(output_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as a tracker should hold it: each numeric key's (stage, value)s."""
    history: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(output_dir):
        for key, value in record.items():
            if is_scalar(value):
                history.setdefault(key, []).append((record["stage"], value))
    return history


def tracker_run_id(output_dir: Path, tracker: str) -> str:
    return json.loads((output_dir / "trackers.json").read_text())[tracker]


def in_mlflow_names(history: dict) -> dict:
    return {mlflow_metric_name(key): points for key, points in history.items()}


def mlflow_history(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    keys = client.get_run(run_id).data.metrics
    return {
        key: sorted((point.step, point.value) for point in client.get_metric_history(run_id, key))
        for key in keys
    }


def test_stage_log_writes_jsonl_and_tensorboard_by_default(tmp_path):
    log_stages(tmp_path, run_config(), range(LAST + 1))

    assert read_metrics(tmp_path)[-1] == stage_metrics(LAST)
    certificates = (tmp_path / "certificates.jsonl").read_text().splitlines()
    assert json.loads(certificates[-1]) == {"stage": LAST, "bandit_lower_bound": None}
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    history = jsonl_history(tmp_path)
    assert set(events.Tags()["scalars"]) == set(history)
    for key, points in history.items():  # TensorBoard keeps float32
        expected = [(stage, pytest.approx(value)) for stage, value in points]
        assert [(event.step, event.value) for event in events.Scalars(key)] == expected
    assert not (tmp_path / "trackers.json").exists()  # TensorBoard has no run to continue


def test_mlflow_server_holds_every_stage_metric_the_config_and_the_outputs_dir(
    tmp_path, mlflow_server
):
    config = run_config(trackers=["mlflow"], mlflow_tracking_uri=mlflow_server)
    log_stages(tmp_path, config, range(LAST + 1))

    client = MlflowClient(tracking_uri=mlflow_server)
    run_id = tracker_run_id(tmp_path, "mlflow")
    history = mlflow_history(client, run_id)
    assert history == in_mlflow_names(jsonl_history(tmp_path))
    assert history["val/pass_at_k"] == [(stage, 0.5 + 0.125 * stage) for stage in range(LAST + 1)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == tmp_path.name
    assert client.get_experiment(run.info.experiment_id).name == "satseq"
    assert run.data.tags["output_dir"] == str(tmp_path.resolve())
    params = run.data.params  # keyed as `--set` keys them, valued as the YAML config spells them
    assert params["team.agents.0.path"] == "builtin:tiny"
    assert params["trainer.lr"] == json.dumps(config.trainer.lr)
    assert params["output.trackers.0"] == "mlflow"
    assert params["output.mlflow_tracking_uri"] == mlflow_server
    assert not (tmp_path / "tensorboard").exists()


def test_resume_continues_the_same_mlflow_run(tmp_path, mlflow_server):
    config = run_config(
        trackers=["mlflow"], mlflow_tracking_uri=mlflow_server, tracker_project=tmp_path.name
    )
    log_stages(tmp_path, config, range(2))  # stopped after stage 1's checkpoint
    first_run = tracker_run_id(tmp_path, "mlflow")
    log_stages(tmp_path, config, range(2, LAST + 2), resume_after_stage=1)

    client = MlflowClient(tracking_uri=mlflow_server)
    assert tracker_run_id(tmp_path, "mlflow") == first_run
    experiment = client.get_experiment_by_name(tmp_path.name)
    assert [run.info.run_id for run in client.search_runs([experiment.experiment_id])] == [
        first_run
    ]
    assert mlflow_history(client, first_run) == in_mlflow_names(jsonl_history(tmp_path))
    assert [step for step, _ in jsonl_history(tmp_path)["reward/mean"]] == list(range(LAST + 2))
    log_stages(tmp_path, config, range(1))  # a fresh start in the same dir: a run of its own
    assert tracker_run_id(tmp_path, "mlflow") != first_run


def test_mlflow_default_store_is_a_sqlite_file_in_the_outputs_dir(tmp_path):
    log_stages(tmp_path, run_config(trackers=["mlflow"]), range(LAST + 1))

    store = tmp_path / "mlflow" / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    history = mlflow_history(client, tracker_run_id(tmp_path, "mlflow"))
    assert history == in_mlflow_names(jsonl_history(tmp_path))


def inspect_wandb(run_dir: Path, *flags: str) -> str:
    """`wandb leet inspect`: W&B's own reader of an offline run's .wandb log."""
    command = [BIN / "wandb", "leet", "inspect", "--json", *flags, str(run_dir)]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def wandb_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Each logged key's (step, value)s, W&B's own `_step`, `_runtime`, ... left out."""
    history: dict[str, list[tuple[int, float]]] = {}
    for line in inspect_wandb(run_dir).splitlines():
        record = json.loads(line)
        if record["type"] == "history":
            items = record["history"]["item"]
            for key, value in items.items():
                if not key.startswith("_"):
                    history.setdefault(key, []).append((items["_step"], value))
    return history


def offline_runs(output_dir: Path) -> list[Path]:
    return sorted((output_dir / "wandb").glob("offline-run-*"))


def test_wandb_without_an_api_key_writes_an_offline_run_with_every_stage(tmp_path, no_wandb_key):
    config = run_config(trackers=["wandb"])
    log_stages(tmp_path, config, range(LAST + 1))

    [run_dir] = offline_runs(tmp_path)
    assert wandb_history(run_dir) == jsonl_history(tmp_path)
    run = json.loads(inspect_wandb(run_dir, "--summary"))
    assert run["run_id"] == tracker_run_id(tmp_path, "wandb")
    last = {key: value for key, value in stage_metrics(LAST).items() if is_scalar(value)}
    assert {key: run["summary"][key] for key in last} == last
    assert "swap/a0" not in run["summary"]
    assert (run["state"], run["project"], run["name"]) == ("finished", "satseq", tmp_path.name)
    assert run["config"]["output_dir"] == str(tmp_path.resolve())
    assert run["config"]["trainer"]["lr"] == config.trainer.lr


def test_resume_continues_the_same_wandb_run(tmp_path, no_wandb_key):
    """Offline, a resumed run is a second offline-run dir under the same id, and `wandb sync`
    uploads the two as one run."""
    config = run_config(trackers=["wandb"])
    log_stages(tmp_path, config, range(2))
    log_stages(tmp_path, config, range(2, LAST + 1), resume_after_stage=1)

    first, resumed = offline_runs(tmp_path)
    run_ids = [json.loads(inspect_wandb(part, "--summary"))["run_id"] for part in (first, resumed)]
    assert run_ids == [tracker_run_id(tmp_path, "wandb")] * 2
    assert wandb_history(resumed)["reward/mean"] == jsonl_history(tmp_path)["reward/mean"][2:]


def test_an_unreachable_tracker_warns_and_the_run_goes_on(tmp_path, caplog):
    nobody_listens = f"http://127.0.0.1:{free_port()}"
    config = run_config(trackers=["mlflow", "tensorboard"], mlflow_tracking_uri=nobody_listens)
    started = time.perf_counter()
    log = log_stages(tmp_path, config, range(LAST + 1))

    assert time.perf_counter() - started < 60  # MLflow's own retries would take minutes
    [warning] = [r for r in caplog.records if r.name == "satseq.cluster.trackers"]
    assert warning.levelname == "WARNING"
    assert warning.getMessage().startswith("mlflow tracker failed, the run goes on without it")
    assert nobody_listens in warning.getMessage()
    assert log.trackers.failed == {"mlflow": warning.getMessage()}  # for the driver to print
    assert [m["stage"] for m in read_metrics(tmp_path)] == list(range(LAST + 1))
    assert (tmp_path / "tensorboard").is_dir()  # the other trackers carry on
    assert not (tmp_path / "trackers.json").exists()  # no run to continue


def test_a_tracker_lost_mid_run_is_dropped_after_one_warning(tmp_path, mlflow_server, caplog):
    log = StageLog(tmp_path, run_config(trackers=["mlflow"], mlflow_tracking_uri=mlflow_server))
    log.write(stage_metrics(0), {"stage": 0})
    [mlflow] = log.trackers.active
    mlflow.client = MlflowClient(f"http://127.0.0.1:{free_port()}")  # its server went away
    for stage in range(1, LAST + 1):
        log.write(stage_metrics(stage), {"stage": stage})
    log.close()

    assert log.trackers.active == []
    [warning] = [r for r in caplog.records if r.name == "satseq.cluster.trackers"]
    assert "mlflow tracker failed" in warning.getMessage()
    assert [m["stage"] for m in read_metrics(tmp_path)] == list(range(LAST + 1))
    history = mlflow_history(MlflowClient(tracking_uri=mlflow_server), mlflow.run_id)
    assert history["reward/mean"] == [(0, 0.0)]


def test_the_old_tensorboard_flag_still_sets_the_trackers():
    with pytest.warns(FutureWarning, match=r"it is output\.trackers: \[\] "):
        assert run_config(tensorboard=False).output.trackers == []
    with pytest.warns(FutureWarning, match=r"it is output\.trackers: \[tensorboard\] "):
        assert run_config(tensorboard=True).output.trackers == ["tensorboard"]
    assert run_config().output.trackers == ["tensorboard"]
    with pytest.raises(ValueError, match=r"give only output\.trackers"):
        run_config(tensorboard=True, trackers=["mlflow"])
    with pytest.raises(ValueError, match="listed twice"):
        run_config(trackers=["wandb", "wandb"])


@pytest.mark.slow
def test_a_trained_run_logs_every_stage_to_every_tracker(straight_run):
    """The coordinator's StageLog, in a real `satseq train` (`straight_run` names all three)."""
    history = jsonl_history(straight_run)
    assert [step for step, _ in history["stage"]] == list(range(STRAIGHT_STAGES))
    client = MlflowClient(tracking_uri=f"sqlite:///{straight_run / 'mlflow' / 'mlflow.db'}")
    assert mlflow_history(client, tracker_run_id(straight_run, "mlflow")) == in_mlflow_names(
        history
    )
    [run_dir] = offline_runs(straight_run)
    assert wandb_history(run_dir) == history
