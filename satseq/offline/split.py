"""Step 1 of the offline values: shard a dataset into `subset_<i>.parquet` files (§4).

Each subset is estimated on its own (`estimate`), so that a long estimation can be spread over
machines or restarted one subset at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from satseq.data import load_problems, write_subsets


@dataclass(frozen=True)
class SplitReport:
    source: str
    format_name: str
    paths: list[Path]
    sizes: list[int]
    skipped_rows: list[str]  # "file:line: why" of each row left out (skip_bad_rows only)


def split_dataset(
    dataset: str | Path,
    output_dir: str | Path,
    num_subsets: int,
    split: str = "train",
    field_map: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> SplitReport:
    """Load `dataset` (a .jsonl/.parquet path or a Hub name[:config]) and write its subsets."""
    import pyarrow.parquet as pq

    loaded = load_problems(dataset, split, field_map, skip_bad_rows)
    paths = write_subsets(loaded.problems, output_dir, num_subsets)
    sizes = [pq.read_metadata(path).num_rows for path in paths]  # as written, not as planned
    return SplitReport(loaded.source, loaded.format_name, paths, sizes, loaded.skipped_rows)
