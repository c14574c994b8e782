"""The builtin-model cache: built once per config, renamed into place only when complete."""

import time
from dataclasses import replace

import pytest

from satseq.models import BUILTIN_MODELS, UnknownBuiltinModelError, resolve_builtin
from satseq.models.cache import builtin_build_config, cached_build, default_cache_dir


def test_second_resolve_reuses_the_build(tiny_model_dir, model_cache_dir):
    weights = tiny_model_dir / "model.safetensors"
    modified = weights.stat().st_mtime_ns
    started = time.perf_counter()
    again = resolve_builtin("builtin:tiny", cache_dir=model_cache_dir)
    assert time.perf_counter() - started < 5.0
    assert again == tiny_model_dir
    assert weights.stat().st_mtime_ns == modified
    assert (
        tiny_model_dir.name.removeprefix("tiny-")
        == builtin_build_config("builtin:tiny").fingerprint()
    )


def test_every_build_setting_changes_the_fingerprint():
    config = builtin_build_config("builtin:tiny")
    changed = [
        replace(config, seed=1),
        replace(config, variant="tool"),
        replace(config, size="50m"),
        replace(config, format_version=config.format_version + 1),
        replace(config, warm_start=replace(config.warm_start, steps=config.warm_start.steps + 1)),
        replace(config, warm_start=replace(config.warm_start, learning_rate=1e-3)),
        replace(config, architecture=replace(config.architecture, num_hidden_layers=3)),
    ]
    fingerprints = {config.fingerprint()} | {other.fingerprint() for other in changed}
    assert len(fingerprints) == 1 + len(changed)
    assert builtin_build_config("builtin:tiny").fingerprint() == config.fingerprint()


def test_the_quickstart_team_differs_by_teacher_and_seed():
    configs = [builtin_build_config(f"builtin:tiny-carry-{k}") for k in range(3)]
    assert [c.variant for c in configs] == ["carry"] * 3
    assert [c.seed for c in configs] == [0, 1, 2]
    assert len({c.teacher for c in configs}) == 3
    assert len({c.fingerprint() for c in configs}) == 3
    other_teacher = replace(configs[0], teacher=replace(configs[0].teacher, carry_slip=0.5))
    assert other_teacher.fingerprint() != configs[0].fingerprint()


def test_cached_build_builds_once(tmp_path):
    builds = []

    def build(out_dir):
        builds.append(out_dir)
        (out_dir / "config.json").write_text("{}")

    target = tmp_path / "cache" / "model-abc"
    assert cached_build(target, build) == target
    assert cached_build(target, build) == target
    assert len(builds) == 1
    assert builds[0] != target  # built elsewhere, then renamed into place
    assert (target / "config.json").read_text() == "{}"


def test_a_crashed_build_leaves_nothing_that_looks_complete(tmp_path):
    target = tmp_path / "model-abc"

    def crash(out_dir):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_build(target, crash)
    assert not target.exists()
    assert not list(tmp_path.glob(".model-abc.tmp-*"))

    # A build killed outright leaves its temporary directory; the next build clears it.
    (tmp_path / ".model-abc.tmp-killed").mkdir()
    cached_build(target, lambda out_dir: (out_dir / "config.json").write_text("{}"))
    assert target.is_dir()
    assert not list(tmp_path.glob(".model-abc.tmp-*"))


def test_default_cache_dir_follows_satseq_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SATSEQ_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    monkeypatch.delenv("SATSEQ_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "satseq", "models")


def test_unknown_builtin_name_lists_the_known_ones():
    with pytest.raises(UnknownBuiltinModelError, match="builtin:tiny-tool"):
        resolve_builtin("builtin:huge")
    assert set(BUILTIN_MODELS) == {
        "builtin:tiny",
        "builtin:tiny-tool",
        "builtin:tiny-carry-0",
        "builtin:tiny-carry-1",
        "builtin:tiny-carry-2",
    }
