"""Split problems into N subsets and write them as `subset_<i>.parquet` (SPO offline values, §4).

Subsets are contiguous: subset 0 holds the first problems, subset N-1 the last, and the first
`len % N` subsets hold one problem more (as `datasets.Dataset.shard(contiguous=True)` does in the
seeds' script). Concatenating the subsets in order gives back the input in its order.

The files have the columns `problem_id, problem, answer, solution, meta` (meta as JSON text), the
`{problem, answer}` format that `load_problems` reads back into equal MathProblems.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from satseq.data.loaders import load_problems
from satseq.data.records import DataError, MathProblem
from satseq.files import write_atomically

SUBSET_FILE_PATTERN = "subset_*.parquet"


def split_problems(problems: Sequence[MathProblem], num_subsets: int) -> list[list[MathProblem]]:
    """`problems` cut into `num_subsets` contiguous, non-empty runs whose sizes differ by <= 1."""
    if num_subsets < 1:
        raise DataError(f"number of subsets must be >= 1, got {num_subsets}")
    if not problems:
        raise DataError("nothing to split: there are no problems")
    if num_subsets > len(problems):
        raise DataError(
            f"cannot split {len(problems)} problems into {num_subsets} subsets without empty "
            f"ones; use at most {len(problems)} subsets"
        )
    base_size, remainder = divmod(len(problems), num_subsets)
    subsets = []
    start = 0
    for index in range(num_subsets):
        size = base_size + (1 if index < remainder else 0)
        subsets.append(list(problems[start : start + size]))
        start += size
    return subsets


def write_problems_parquet(problems: Sequence[MathProblem], path: str | Path) -> Path:
    """Write problems to one parquet file, atomically (a reader never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = pa.table(
        {
            "problem_id": [problem.problem_id for problem in problems],
            "problem": [problem.problem for problem in problems],
            "answer": [problem.answer for problem in problems],
            "solution": pa.array([problem.solution for problem in problems], type=pa.string()),
            # JSON text, because meta differs from row to row and parquet wants one schema.
            "meta": [json.dumps(problem.meta, ensure_ascii=False) for problem in problems],
        }
    )
    return write_atomically(path, lambda handle: pq.write_table(table, handle))


def write_subsets(
    source: str | Path | Sequence[MathProblem],
    output_dir: str | Path,
    num_subsets: int,
    split: str = "train",
    field_map: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> list[Path]:
    """Split a dataset (a source for `load_problems`, or problems) into `subset_<i>.parquet`.

    `split`, `field_map` and `skip_bad_rows` are passed to `load_problems` when `source` is a
    path or dataset name. Returns the written paths, in subset order.
    """
    if isinstance(source, str | Path):
        problems = load_problems(source, split, field_map, skip_bad_rows).problems
    else:
        problems = list(source)
    subsets = split_problems(problems, num_subsets)
    output_dir = Path(output_dir)
    paths = [output_dir / f"subset_{index}.parquet" for index in range(num_subsets)]
    # Leftovers of an earlier split into more subsets would be read with the new ones.
    stale = sorted(set(output_dir.glob(SUBSET_FILE_PATTERN)) - set(paths))
    if stale:
        raise DataError(
            f"{output_dir}: holds subset files that this split would not overwrite "
            f"({', '.join(path.name for path in stale)}); remove them or use another directory"
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    return [
        write_problems_parquet(subset, path) for subset, path in zip(subsets, paths, strict=True)
    ]
