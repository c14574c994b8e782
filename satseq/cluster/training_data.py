"""The problems a run trains on (`data.train`): the synthetic task's split, or a data file."""

from __future__ import annotations

from satseq.config import RunConfig
from satseq.data import MathProblem, load_problems, make_split


def training_problems(config: RunConfig) -> list[MathProblem]:
    data = config.data
    if data.train == "synthetic":
        s = data.synthetic
        return make_split(s.split, s.n_train, seed=s.seed, difficulty=s.difficulty, style=s.style)
    loaded = load_problems(
        data.train, split=data.split, field_map=data.field_map, skip_bad_rows=data.skip_bad_rows
    )
    return loaded.problems
