"""Resume state is written atomically: a crash mid-write leaves the previous checkpoint intact,
and a stage whose run state was never written is not a checkpoint."""

from functools import partial

import pytest
import torch

from satseq.cluster.checkpoint import (
    checkpoint_stages,
    learner_state_path,
    load_latest_run_state,
    save_run_state,
    stage_directory,
)
from satseq.files import write_atomically


def save_stage(directory, stage, keep=2):
    for i in range(2):  # what the learners write, each its own file
        state = {"agent": i}
        write_atomically(learner_state_path(directory, stage, i), partial(torch.save, state))
    save_run_state(directory, stage, {"stage": stage, "w": torch.full((2,), float(stage))}, keep)


def test_save_and_load_latest_keeps_the_newest(tmp_path):
    for stage in range(4):
        save_stage(tmp_path, stage)
    assert checkpoint_stages(tmp_path) == [2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage_2", "stage_3"]
    stage, state = load_latest_run_state(tmp_path)
    assert stage == 3 and torch.equal(state["w"], torch.full((2,), 3.0))
    assert torch.load(learner_state_path(tmp_path, 3, 1)) == {"agent": 1}


def test_a_stage_without_its_run_state_is_no_checkpoint_and_is_cleared_by_the_next(tmp_path):
    """Learners wrote their files, then the coordinator died before run.pt: resume starts from
    the stage before, and the next complete save removes the debris."""
    save_stage(tmp_path, 0)
    write_atomically(learner_state_path(tmp_path, 1, 0), lambda f: torch.save({}, f))
    assert checkpoint_stages(tmp_path) == [0]
    assert load_latest_run_state(tmp_path)[0] == 0
    save_stage(tmp_path, 1, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage_1"]
    stage_directory(tmp_path, 2).mkdir()  # an interrupted later save
    save_stage(tmp_path, 3, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage_1", "stage_3"]


def test_a_crash_mid_write_leaves_the_previous_checkpoint_and_no_debris(tmp_path):
    save_stage(tmp_path, 0)

    def crash_half_way(handle):
        handle.write(b"partial bytes of a checkpoint")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_atomically(tmp_path / "stage_1" / "run.pt", crash_half_way)
    assert checkpoint_stages(tmp_path) == [0]
    assert list((tmp_path / "stage_1").iterdir()) == []
    assert load_latest_run_state(tmp_path)[1]["stage"] == 0


def test_no_checkpoint(tmp_path):
    assert load_latest_run_state(tmp_path / "missing") is None
