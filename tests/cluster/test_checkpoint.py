"""Resume state is written atomically: a crash mid-write leaves the previous checkpoint intact,
and a stage whose run state was never written is not a checkpoint."""

from functools import partial

import pytest
import torch

from satseq.cluster.checkpoint import (
    checkpoint_stages,
    learner_state_path,
    load_latest_run_state,
    prune_saved_stages,
    save_run_state,
    stage_directory,
)
from satseq.files import write_atomically, write_directory_atomically


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


def saved_stage(output_dir, agent, stage):
    directory = output_dir / f"agent_{agent}" / f"stage_{stage}"
    write_directory_atomically(directory, lambda path: (path / "config.json").write_text("{}"))
    return directory


def test_keep_last_prunes_old_saved_stages_but_not_one_a_swap_reads(tmp_path):
    """`output.keep_last: 2`: the newest two stages of every agent stay, and an older one that a
    swapped-in agent's path names; nothing else, and no hidden leftovers."""
    for stage in range(5):
        for agent in ("a0", "a1"):
            saved_stage(tmp_path, agent, stage)
    swapped_from = tmp_path / "agent_a1" / "stage_1"
    removed = prune_saved_stages(tmp_path, ["a0", "a1"], 2, {swapped_from})
    assert sorted(p.name for p in (tmp_path / "agent_a0").iterdir()) == ["stage_3", "stage_4"]
    assert sorted(p.name for p in (tmp_path / "agent_a1").iterdir()) == [
        "stage_1",
        "stage_3",
        "stage_4",
    ]
    assert len(removed) == 5  # stages 0-2 of a0, 0 and 2 of a1


def test_a_directory_write_that_fails_leaves_the_old_one_whole(tmp_path):
    directory = saved_stage(tmp_path, "a0", 0)

    def half_written(path):
        (path / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_directory_atomically(directory, half_written)
    assert [p.name for p in directory.iterdir()] == ["config.json"]  # the old one, untouched
    assert [p.name for p in directory.parent.iterdir()] == ["stage_0"]  # no partial left
    write_directory_atomically(directory, lambda path: (path / "new.json").write_text("1"))
    assert [p.name for p in directory.iterdir()] == ["new.json"]  # replaced whole
    assert [p.name for p in directory.parent.iterdir()] == ["stage_0"]
