"""Where `estimate` writes and `merge` looks: the seeds' directory layout.

    <output_dir>/offline_value_estimation_subset_<i>/validation_data/0.jsonl

one directory per subset, so that `merge`'s default pattern finds every subset's results.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_EXP_NAME = "offline_value_estimation"
SUBSET_EXP_NAME = DEFAULT_EXP_NAME + "_subset_{index}"
RESULTS_RELATIVE_PATH = Path("validation_data") / "0.jsonl"
DEFAULT_RESULTS_PATTERN = f"{DEFAULT_EXP_NAME}_subset_*/{RESULTS_RELATIVE_PATH.as_posix()}"
SUBSET_FILE_NAME = re.compile(r"subset_(\d+)\.(?:parquet|jsonl)")


def results_path(output_dir: str | Path, exp_name: str) -> Path:
    return Path(output_dir) / exp_name / RESULTS_RELATIVE_PATH


def default_exp_name(data_file: str | Path) -> str:
    """`offline_value_estimation_subset_<i>` for a `subset_<i>` file that `split` wrote, so
    that estimating each subset with no --exp_name gives the layout `merge` expects."""
    match = SUBSET_FILE_NAME.fullmatch(Path(data_file).name)
    return SUBSET_EXP_NAME.format(index=match[1]) if match else DEFAULT_EXP_NAME


def natural_key(path: Path) -> list[int | str]:
    """Sort key that puts subset_10 after subset_9."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]
