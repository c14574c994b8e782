"""Which problems `satseq eval` scores: a benchmark name, a local file, or held-out synthetic ones.

- `aime24`, `aime25`, `math` (MATH-500): their Hugging Face datasets, through `load_problems`.
- a `.jsonl` or `.parquet` path: any row format `satseq.data` detects (or `data.field_map`).
- `synthetic:<split>`: `eval.synthetic_problems` problems of that synthetic split. When the run
  trained on the same split, these are the problems right after the `data.synthetic.n_train`
  it trained on: `make_split` is prefix-stable (a longer split starts with the shorter one),
  so they are exactly the ones training never saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from satseq.config import RunConfig
from satseq.data import DataError, MathProblem, load_problems, make_split

SYNTHETIC_PREFIX = "synthetic:"


@dataclass(frozen=True)
class HubDataset:
    name: str
    split: str


HUB_DATASETS = {
    "aime24": HubDataset("HuggingFaceH4/aime_2024", "train"),
    "aime25": HubDataset("math-ai/aime25", "test"),
    "math": HubDataset("HuggingFaceH4/MATH-500", "test"),
}


def resolve_dataset(dataset: str, config: RunConfig) -> list[MathProblem]:
    """The problems `dataset` names (see the module docstring); DataError says what is wrong."""
    if dataset in HUB_DATASETS:
        return _hub_problems(dataset, HUB_DATASETS[dataset])
    if dataset.startswith(SYNTHETIC_PREFIX):
        return held_out_synthetic(dataset.removeprefix(SYNTHETIC_PREFIX), config)
    data = config.data
    return load_problems(
        dataset, field_map=data.field_map, skip_bad_rows=data.skip_bad_rows
    ).problems


def held_out_synthetic(split: str, config: RunConfig) -> list[MathProblem]:
    """`eval.synthetic_problems` problems of `split` that the run's training never used."""
    s = config.data.synthetic
    trained = s.n_train if config.data.train == "synthetic" and s.split == split else 0
    count = config.eval.synthetic_problems
    try:
        problems = make_split(
            split, trained + count, seed=s.seed, difficulty=s.difficulty, style=s.style
        )
    except DataError as error:
        raise DataError(
            f"synthetic:{split}: {error} (training used the first {trained}; lower "
            "eval.synthetic_problems)"
        ) from None
    return problems[trained:]


def _hub_problems(alias: str, hub: HubDataset) -> list[MathProblem]:
    try:
        return load_problems(hub.name, split=hub.split).problems
    except DataError as error:
        raise DataError(
            f"dataset {alias!r} is the Hugging Face dataset {hub.name} (split {hub.split}), "
            f"which could not be loaded here: {error}\n"
            "Without network, export it on a connected machine:\n"
            f"  python -c \"import datasets; datasets.load_dataset('{hub.name}', "
            f"split='{hub.split}').to_json('{alias}.jsonl')\"\n"
            f"then copy the file here and pass --dataset {alias}.jsonl"
        ) from None
