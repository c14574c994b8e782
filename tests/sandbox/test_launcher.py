"""The launcher's own steps, run in this process on a temporary directory."""

import base64
import os

from satseq.sandbox import launcher


def test_input_files_are_written_with_their_directories(tmp_path):
    content = bytes(range(256))
    launcher.write_inputs(str(tmp_path), {"a/b/c.bin": base64.b64encode(content).decode()})
    assert (tmp_path / "a/b/c.bin").read_bytes() == content


def test_only_regular_files_within_the_size_limit_are_fetched(tmp_path):
    (tmp_path / "small").write_bytes(b"12345")
    (tmp_path / "large").write_bytes(b"x" * 11)
    os.mkfifo(tmp_path / "fifo")  # would block a plain read for ever
    (tmp_path / "dir").mkdir()
    names = ["small", "large", "fifo", "dir", "missing"]
    fetched = launcher.read_outputs(str(tmp_path), names, max_bytes=10)
    assert fetched == {"small": base64.b64encode(b"12345").decode()}


def test_the_program_gets_its_limits_and_its_exit_status_comes_back():
    argv = ["/bin/sh", "-c", "test $(ulimit -n) -eq 32 && exit 7"]
    exit_code, cpu_s = launcher.run_program(argv, {}, {"NOFILE": [32, 32]})
    assert exit_code == 7 and cpu_s >= 0
    exit_code, _ = launcher.run_program(["/bin/sh", "-c", "kill -9 $$"], {}, {})
    assert exit_code == -9


def test_landlock_is_available_on_this_kernel():
    assert launcher.landlock_abi() >= 1
