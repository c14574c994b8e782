"""The zygote's own steps on files, run in this process on a temporary directory."""

import base64
import os

from satseq.sandbox import confine, zygote


def test_input_files_are_written_with_their_directories(tmp_path):
    content = bytes(range(256))
    zygote.write_inputs(str(tmp_path), {"a/b/c.bin": base64.b64encode(content).decode()})
    assert (tmp_path / "a/b/c.bin").read_bytes() == content


def test_only_regular_files_within_the_size_limit_are_fetched(tmp_path):
    (tmp_path / "small").write_bytes(b"12345")
    (tmp_path / "large").write_bytes(b"x" * 11)
    os.mkfifo(tmp_path / "fifo")  # would block a plain read for ever
    (tmp_path / "dir").mkdir()
    names = ["small", "large", "fifo", "dir", "missing"]
    fetched = zygote.read_outputs(str(tmp_path), names, max_bytes=10)
    assert fetched == {"small": base64.b64encode(b"12345").decode()}


def test_emptying_a_directory_undoes_whatever_a_run_did_to_permissions(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("not the run's")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o755)
    locked = scratch / "a" / "b"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    os.chmod(locked, 0)
    os.chmod(scratch / "a", 0o100)
    (scratch / "link").symlink_to(outside)
    os.mkfifo(scratch / "fifo")
    os.chmod(scratch, 0o500)
    zygote.empty_directory(str(scratch), 0o755)
    assert os.listdir(scratch) == []
    assert (scratch.stat().st_mode & 0o777) == 0o755
    assert (outside / "kept").read_text() == "not the run's"


def test_landlock_is_available_on_this_kernel():
    assert confine.landlock_abi() >= 1
