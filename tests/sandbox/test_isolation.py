"""Layers add up to a level; a pool is as strong as its weakest slot; below the minimum the
backend refuses to start, and says what is missing and why."""

import pytest

from satseq.sandbox.isolation import IsolationReport, Layer, SandboxUnavailable, combine, require
from satseq.sandbox.types import IsolationLevel

ALL = {layer: "" for layer in Layer}


def report_without(*layers: Layer) -> IsolationReport:
    return IsolationReport(
        active={layer: "" for layer in Layer if layer not in layers},
        missing={layer: f"no {layer} here" for layer in layers},
    )


@pytest.mark.parametrize(
    ("missing", "level"),
    [
        ((), IsolationLevel.FULL),
        ((Layer.CGROUP,), IsolationLevel.NAMESPACES),
        ((Layer.SLOT_UID, Layer.SECCOMP), IsolationLevel.NAMESPACES),
        ((Layer.BUBBLEWRAP,), IsolationLevel.RLIMITS),
        ((Layer.RLIMITS,), IsolationLevel.NONE),
        ((Layer.SUBREAPER, Layer.BUBBLEWRAP), IsolationLevel.NONE),
    ],
)
def test_the_level_is_the_highest_whose_layers_are_all_active(missing, level):
    assert report_without(*missing).level == level


def test_a_pool_counts_a_layer_only_if_every_slot_has_it():
    pool = combine([IsolationReport(active=ALL), report_without(Layer.LANDLOCK)])
    assert pool.level == IsolationLevel.NAMESPACES
    assert pool.missing == {Layer.LANDLOCK: "no landlock here"}


def test_below_the_minimum_the_error_names_each_missing_layer_and_its_reason():
    report = report_without(Layer.BUBBLEWRAP, Layer.CGROUP)
    require(report, IsolationLevel.RLIMITS)
    with pytest.raises(SandboxUnavailable) as error:
        require(report, IsolationLevel.FULL)
    message = str(error.value)
    assert "rlimits, below the configured minimum sandbox.min_isolation=full" in message
    assert "bubblewrap: no bubblewrap here" in message
    assert "cgroup: no cgroup here" in message


def test_the_log_line_lists_active_layers_with_details_and_missing_ones_with_reasons():
    report = IsolationReport(
        active={Layer.LANDLOCK: "abi 7", Layer.RLIMITS: ""},
        missing={Layer.BUBBLEWRAP: "bwrap not found"},
    )
    assert report.describe() == (
        "sandbox isolation: none [landlock (abi 7), rlimits]; missing: bubblewrap: bwrap not found"
    )


def test_a_pool_lists_the_range_of_per_slot_details():
    slots = [IsolationReport(active={Layer.SLOT_UID: f"uid {uid}"}) for uid in (61002, 61000)]
    assert combine(slots).active == {Layer.SLOT_UID: "uid 61000 .. uid 61002"}


def test_interpreter_under_tmp_is_bound_after_the_sandbox_tmpfs(tmp_path):
    """A venv in a clone under /tmp must stay visible: its bind comes after `--tmpfs /tmp`."""
    from pathlib import Path

    from satseq.sandbox.bubblewrap import bwrap_command

    venv = Path("/tmp/some-clone/.venv")
    command = bwrap_command("bwrap", [venv], [tmp_path / "zygote.py"], disk_mb=8)
    tmpfs_at = command.index("/tmp", command.index("--tmpfs"))
    bind_at = command.index(str(venv))
    assert command[bind_at - 1] == "--ro-bind" and bind_at > tmpfs_at
    assert command.index("--remount-ro") > bind_at
