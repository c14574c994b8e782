"""Layers add up to a level; a pool is as strong as its weakest slot; below the minimum the
backend refuses to start, and says what is missing and why."""

from pathlib import Path

import pytest

from satseq.sandbox.bubblewrap import SCRATCH, bwrap_command
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


def test_nothing_of_the_host_is_bound_inside_a_scratch_directory(tmp_path):
    """The zygote empties /tmp between runs: a venv in a checkout under /tmp is shown under
    /run/satseq/host instead, and the other paths at their own."""
    venv, elsewhere = Path("/tmp/some-clone/.venv"), Path("/opt/python")
    scratch_tmpfs = tmp_path / "tmp"
    command = bwrap_command(
        "bwrap", [venv, elsewhere], [tmp_path / "zygote.py"], 8, {"/tmp": scratch_tmpfs}
    )
    binds = [
        (Path(command[at + 1]), Path(command[at + 2]))
        for at, argument in enumerate(command)
        if argument in ("--bind", "--ro-bind")
    ]
    assert (venv, Path("/run/satseq/host/tmp/some-clone/.venv")) in binds
    assert (elsewhere, elsewhere) in binds
    assert (scratch_tmpfs, Path("/tmp")) in binds
    inside_scratch = [
        target
        for _, target in binds
        for directory in SCRATCH
        if target.is_relative_to(directory) and target != Path(directory)
    ]
    assert inside_scratch == []
