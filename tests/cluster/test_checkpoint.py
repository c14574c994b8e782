"""Resume state is written atomically: a crash mid-write leaves the previous checkpoint intact."""

import pytest
import torch

from satseq.cluster.checkpoint import checkpoint_stages, load_latest_checkpoint, save_checkpoint
from satseq.files import write_atomically


def test_save_and_load_latest_keeps_the_newest(tmp_path):
    for stage in range(4):
        save_checkpoint(
            tmp_path, stage, {"stage": stage, "w": torch.full((2,), float(stage))}, keep=2
        )
    assert checkpoint_stages(tmp_path) == [2, 3]
    stage, state = load_latest_checkpoint(tmp_path)
    assert stage == 3 and torch.equal(state["w"], torch.full((2,), 3.0))


def test_a_crash_mid_write_leaves_the_previous_checkpoint_and_no_debris(tmp_path):
    save_checkpoint(tmp_path, 0, {"stage": 0})

    def crash_half_way(handle):
        handle.write(b"partial bytes of a checkpoint")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        write_atomically(tmp_path / "stage_1.pt", crash_half_way)
    assert checkpoint_stages(tmp_path) == [0]
    assert [p.name for p in tmp_path.iterdir()] == ["stage_0.pt"]
    assert load_latest_checkpoint(tmp_path)[1] == {"stage": 0}


def test_no_checkpoint(tmp_path):
    assert load_latest_checkpoint(tmp_path / "missing") is None
