"""A trained-looking team: builtin:tiny copies laid out as a training output dir."""

import shutil

import pytest

from satseq.models import resolve_model_path

AGENTS = ("a0", "a1", "a2")


@pytest.fixture(autouse=True)
def _builtins_built(builtin_models):
    """These tests resolve builtin:tiny and builtin:tiny-tool: built, two at a time, first."""


def copy_team(root, layout: str):
    """builtin:tiny for every agent: `training` = agent_<name>/stage_{0,2}/, `per_agent` =
    <name>/."""
    tiny = resolve_model_path("builtin:tiny")
    for name in AGENTS:
        if layout == "training":
            for stage in (0, 2):
                shutil.copytree(tiny, root / f"agent_{name}" / f"stage_{stage}")
        else:
            shutil.copytree(tiny, root / name)
    return root


@pytest.fixture(scope="session")
def training_output_dir(tmp_path_factory):
    return copy_team(tmp_path_factory.mktemp("run"), "training")
