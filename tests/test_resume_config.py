"""What `satseq train --resume` and `--from-checkpoint` train with: the run's saved config, changed
only where a continued run stays the same run; a directory with no run is an error. (The resume
itself is tests/cluster/test_train_resume.py's, with SIGKILLed runs.)"""

from pathlib import Path

import pytest
import typer

from satseq.cli.train import continued_run
from satseq.config import QUICKSTART, TRAIN_CONFIG, dump_config, load_config
from satseq.config.resume import unsafe_differences


def a_run(directory: Path, *overrides: str, stage: int = 2) -> Path:
    """An output directory as `satseq train` leaves it: its config and a complete checkpoint."""
    directory.mkdir(parents=True)
    (directory / TRAIN_CONFIG).write_text(dump_config(load_config(QUICKSTART, list(overrides))))
    checkpoint = directory / "checkpoints" / f"stage_{stage}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "run.pt").write_bytes(b"state")
    (checkpoint / "learner_0.pt").write_bytes(b"learner")
    return directory


def test_the_output_directory_alone_resumes_with_the_runs_config(tmp_path):
    run = a_run(tmp_path / "run", "trainer.lr=3.0e-4", "trainer.seed=7")
    config, out = continued_run(None, None, ["trainer.stages=40"], run, False, None)
    assert out == run
    assert (config.trainer.lr, config.trainer.seed, config.trainer.stages) == (3.0e-4, 7, 40)


def test_a_change_that_makes_another_run_is_refused_showing_it_unless_forced(tmp_path, capsys):
    run = a_run(tmp_path / "run")
    with pytest.raises(typer.Exit) as exit_:
        continued_run(None, ["trainer.lr=1.0"], None, run, False, None)
    assert exit_.value.exit_code == 2
    error = capsys.readouterr().err
    assert "trainer.lr: 5e-05 → 1.0" in error and "--force" in error
    config, _ = continued_run(None, ["trainer.lr=1.0"], None, run, True, None)
    assert config.trainer.lr == 1.0
    # a CONFIG that is not the run's: its differences are named
    with pytest.raises(typer.Exit):
        continued_run(Path("configs/smollm2.yaml"), None, None, run, False, None)
    assert "team.agents" in capsys.readouterr().err


def test_a_directory_with_no_run_is_an_error_not_a_fresh_start(tmp_path, capsys):
    with pytest.raises(typer.Exit):
        continued_run(None, None, None, tmp_path / "typo", False, None)
    assert "holds no run" in capsys.readouterr().err


def test_a_node_that_never_held_the_run_resumes_with_the_config_saved_in_storage(tmp_path, capsys):
    """`--resume --output-dir EMPTY --set output.storage=URI` on a new machine: the run's saved
    config comes from the storage the overrides name (its checkpoints too, at the coordinator)."""
    storage = a_run(tmp_path / "storage", "trainer.seed=7")  # as the driver uploaded it
    stored = [f"output.storage={storage}", "trainer.stages=40"]
    config, out = continued_run(None, None, stored, tmp_path / "new", False, None)
    assert (config.trainer.seed, config.trainer.stages) == (7, 40)
    assert (out / TRAIN_CONFIG).read_text() == (storage / TRAIN_CONFIG).read_text()
    with pytest.raises(typer.Exit):  # nothing there either
        stored = [f"output.storage={tmp_path / 'empty'}"]
        continued_run(None, None, stored, tmp_path / "other", False, None)
    assert "holds no run" in capsys.readouterr().err


def test_from_checkpoint_starts_a_new_run_from_that_stage(tmp_path, capsys):
    source = a_run(tmp_path / "source", "trainer.seed=3", stage=5)
    checkpoint = source / "checkpoints" / "stage_5"
    config, out = continued_run(None, None, None, tmp_path / "new", False, checkpoint)
    assert out == tmp_path / "new" and config.trainer.seed == 3
    assert (out / "checkpoints" / "stage_5" / "run.pt").read_bytes() == b"state"
    with pytest.raises(typer.Exit):  # not into a directory that holds a run
        continued_run(None, None, None, source, False, checkpoint)
    assert "already holds a run" in capsys.readouterr().err
    for wrong in (source / "stage_5", source / "checkpoints" / "stage_9"):
        with pytest.raises(typer.Exit):
            continued_run(None, None, None, tmp_path / "other", False, wrong)


def test_only_stage_count_logging_and_outputs_are_safe_to_change():
    saved = load_config(QUICKSTART)
    safe = load_config(QUICKSTART, ["trainer.stages=99", "output.trackers=[]", "eval.seed=3"])
    assert unsafe_differences(saved, safe) == {}
    unsafe = load_config(QUICKSTART, ["rollout.temperature=0.5", "trainer.stages=99"])
    assert list(unsafe_differences(saved, unsafe)) == ["rollout.temperature"]
