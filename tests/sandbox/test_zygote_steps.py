"""The zygote's own steps on files, run on a temporary directory in this process (or a child
of it in a mount namespace of its own)."""

import base64
import os
import subprocess
import sys

import pytest

from satseq.sandbox import confine, scratch, zygote


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


def test_resetting_a_directory_undoes_whatever_a_run_did_to_it_and_in_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("not the run's")
    directory = tmp_path / "scratch"
    directory.mkdir(mode=0o755)
    original = scratch.metadata(str(directory))
    locked = directory / "a" / "b"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    os.chmod(locked, 0)
    os.chmod(directory / "a", 0o100)
    (directory / "link").symlink_to(outside)
    os.mkfifo(directory / "fifo")
    os.setxattr(directory, "user.satseq", b"left by the run")
    os.utime(directory, (1234567890, 1234567890))
    os.chmod(directory, 0o500)
    scratch.reset(str(directory), original)
    assert scratch.metadata(str(directory)) == original  # before listing it sets its atime
    assert os.listdir(directory) == []
    assert (outside / "kept").read_text() == "not the run's"


EMPTY_ACROSS_A_MOUNT = """
import ctypes, os, sys
from satseq.sandbox import scratch
directory = sys.argv[1]
inner = os.path.join(directory, 'inner')
os.mkdir(inner)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mount(b'tmpfs', inner.encode(), b'tmpfs', 0, None) == 0, ctypes.get_errno()
open(os.path.join(inner, 'kept'), 'w').close()
try:
    scratch.empty_directory(directory)
except OSError as error:
    print(os.strerror(error.errno), os.listdir(inner))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_emptying_never_crosses_into_another_mount(tmp_path):
    result = subprocess.run(
        ["unshare", "--mount", sys.executable, "-c", EMPTY_ACROSS_A_MOUNT, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == "Invalid cross-device link ['kept']\n", result.stderr


def test_landlock_is_available_on_this_kernel():
    assert confine.landlock_abi() >= 1
