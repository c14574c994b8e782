"""`output.storage` (`satseq.storage.StorageMirror`): a run's checkpoints and saved stages copied
to a URI and fetched back by a node that lacks them, on a shared path, a `file://` URI and a real
S3 server (moto's, on 127.0.0.1); an interrupted upload leaves nothing under the final name; a
checkpoint complete at the URI is one to resume from, and pruning reaches the URI."""

import shutil
from functools import partial

import pytest
import torch

from satseq.cluster.checkpoint import (
    checkpoint_stages,
    learner_state_path,
    load_latest_run_state,
    prune_saved_stages,
    save_run_state,
)
from satseq.config import load_config
from satseq.config.load import ConfigError
from satseq.files import write_atomically, write_directory_atomically
from satseq.storage import StorageMirror


@pytest.fixture(params=["path", "file", "s3"])
def storage(request, tmp_path):
    """A mirror of `tmp_path / "run"` (the outputs dir, relative names as the run gives them)
    at a fresh location of each kind."""
    if request.param == "s3":
        uri = request.getfixturevalue("s3_bucket")(tmp_path.name)
    elif request.param == "file":
        uri = (tmp_path / "shared").as_uri()
    else:
        uri = str(tmp_path / "shared")
    return StorageMirror(tmp_path / "run", uri)


def a_saved_stage(directory):
    def write(path):
        (path / "model.safetensors").write_bytes(b"\x00" * 4096)
        (path / "config.json").write_text('{"model_type": "qwen2"}')
        (path / "sub").mkdir()
        (path / "sub" / "extra.txt").write_text("x")

    return write_directory_atomically(directory, write)


def test_a_file_and_a_directory_come_back_on_a_node_without_them(storage):
    root = storage.local_root
    learner_file = write_atomically(
        learner_state_path(root / "checkpoints", 0, 1), partial(torch.save, {"w": torch.ones(3)})
    )
    saved = a_saved_stage(root / "agent_a0" / "stage_0")
    storage.upload(learner_file)
    storage.upload(saved)
    shutil.rmtree(root)  # the node that wrote them is gone

    assert storage.names(root / "agent_a0") == ["stage_0"]
    assert storage.exists(learner_file) and not storage.exists(root / "agent_a1")
    assert storage.fetch(learner_file) and storage.fetch(saved)
    assert torch.equal(torch.load(learner_file)["w"], torch.ones(3))
    assert sorted(p.relative_to(saved).as_posix() for p in saved.rglob("*")) == [
        "config.json",
        "model.safetensors",
        "sub",
        "sub/extra.txt",
    ]
    assert (saved / "model.safetensors").read_bytes() == b"\x00" * 4096
    assert [p.name for p in saved.parent.iterdir()] == ["stage_0"]  # nothing fetched aside
    assert storage.fetch(saved)  # held now: nothing to download

    storage.remove(saved)
    assert not storage.exists(saved) and storage.names(root / "agent_a0") == []
    shutil.rmtree(saved)
    assert not storage.fetch(saved)  # neither here nor there


def test_paths_outside_the_outputs_dir_are_not_the_runs(storage, tmp_path):
    model = tmp_path / "a-users-model"
    assert not storage.fetch(model)  # a swap's model of the user's: left alone
    with pytest.raises(ValueError, match="not under the run's outputs directory"):
        storage.upload(model)


def test_an_interrupted_upload_leaves_nothing_under_the_final_name(storage, monkeypatch):
    root = storage.local_root
    path = write_atomically(root / "checkpoints" / "stage_0" / "run.pt", lambda f: f.write(b"1"))

    def killed_mid_copy(source, target, length):
        target.write(b"partial")
        raise OSError("killed mid-upload")

    monkeypatch.setattr("satseq.storage.shutil.copyfileobj", killed_mid_copy)
    with pytest.raises(OSError, match="killed mid-upload"):
        storage.upload(path)
    assert not storage.exists(path)
    assert checkpoint_stages(root / "nowhere", storage) == []


def test_a_checkpoint_complete_at_the_uri_is_resumed_and_old_ones_pruned_there(storage):
    checkpoints = storage.local_root / "checkpoints"
    for stage in range(4):
        for i in range(2):  # the learners write and upload their files first
            path = learner_state_path(checkpoints, stage, i)
            storage.upload(write_atomically(path, partial(torch.save, {"agent": i})))
        save_run_state(checkpoints, stage, {"stage": stage + 1}, keep=2, storage=storage)
    assert storage.names(checkpoints) == ["stage_2", "stage_3"]

    shutil.rmtree(storage.local_root)  # resumed on another node
    assert checkpoint_stages(checkpoints, storage) == [2, 3]
    stage, state = load_latest_run_state(checkpoints, storage)
    assert (stage, state) == (3, {"stage": 4})
    storage.fetch(learner_state_path(checkpoints, 3, 1))
    assert torch.load(learner_state_path(checkpoints, 3, 1)) == {"agent": 1}


def test_keep_last_prunes_saved_stages_written_on_other_nodes_too(storage):
    root = storage.local_root
    for stage in range(3):
        storage.upload(a_saved_stage(root / "agent_a0" / f"stage_{stage}"))
    shutil.rmtree(root / "agent_a0" / "stage_0")  # written on a node since lost: only there
    removed = prune_saved_stages(root, ["a0"], 1, set(), storage)
    assert sorted(p.name for p in removed) == ["stage_0", "stage_1"]
    assert storage.names(root / "agent_a0") == ["stage_2"]
    assert [p.name for p in (root / "agent_a0").iterdir()] == ["stage_2"]


def test_a_storage_uri_of_an_unknown_scheme_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"output.storage: .*'ftp://host/run'.*s3"):
        load_config(None, ["output.storage=ftp://host/run"])
