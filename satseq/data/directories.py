"""Rows of a dataset directory: what `datasets`' `save_to_disk` writes, or a dataset's files laid
out as on the Hugging Face Hub (or simply a directory of data files).

- `save_to_disk` output (`state.json`, or `dataset_dict.json` and a directory per split) is read
  with `datasets.load_from_disk`; rows are addressed `DIR[split]:row i`.
- Any other directory is read one split at a time, the split's files resolved by `datasets`
  itself, as `load_dataset(DIR)` would: the README's `configs:` (`DIR:CONFIG` picks one), file
  names such as `data/train-00000-of-00001.parquet`, `test.jsonl` or `train/part_0.jsonl`; a
  directory whose file names name no split is all `train` (the seeds' `subset_<k>` files).
  The files are read here, in natural order (subset_2 before subset_10), so that a bad row is
  named by its own file and line.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from satseq.data.records import DataError
from satseq.data.rows import (
    DATA_FILE_SUFFIXES,
    RawRow,
    natural_order,
    numbered_rows,
    read_data_file,
)

SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")


def read_dataset_directory(directory: Path, split: str, config: str | None) -> Iterator[RawRow]:
    """The rows of `split` (and, for a Hub layout with several configs, `config`)."""
    if any((directory / marker).is_file() for marker in SAVED_DATASET_MARKERS):
        return _read_saved_dataset(directory, split)
    files = split_files(directory, split, config)
    return itertools.chain.from_iterable(read_data_file(path) for path in files)


def split_files(directory: Path, split: str, config: str | None = None) -> list[Path]:
    """The data files of `split` in `directory`, in natural order, as `datasets` assigns them."""
    data_files = [
        path
        for path in directory.rglob("*")
        if path.suffix in DATA_FILE_SUFFIXES
        and not any(part.startswith(".") for part in path.relative_to(directory).parts)
    ]
    if not data_files:
        raise DataError(f"{directory}: a directory with no .jsonl or .parquet files in it")
    if len({path.suffix for path in data_files}) > 1:
        # `datasets` reads the most common type and drops the others without a word.
        raise DataError(
            f"{directory}: holds both .jsonl and .parquet files, and a dataset directory is read "
            "as one type; keep one type there, or list the files in data.train"
        )
    datasets = import_datasets(str(directory))
    try:
        builder = datasets.load_dataset_builder(str(directory), config)
    except ValueError as error:  # a README with several configs and none (or a wrong one) named
        # `datasets` goes on with a `load_dataset(...)` example, which is not how it is named here
        reason = str(error).split("\nExample of usage")[0].replace("\n", " ")
        raise DataError(f"{directory}: {reason} (name a config as {directory}:CONFIG)") from None
    splits = {str(name): files for name, files in builder.config.data_files.items()}
    if split not in splits:
        raise DataError(
            f"{directory}: no {split!r} split; its files make the splits {sorted(splits)} "
            "(data.split picks the one training reads)"
        )
    return natural_order(Path(file) for file in splits[split])


def _read_saved_dataset(directory: Path, split: str) -> Iterator[RawRow]:
    datasets = import_datasets(str(directory))
    try:
        saved = datasets.load_from_disk(str(directory))
    except Exception as error:  # corrupt state.json, missing arrow files, ...
        raise DataError(
            f"{directory}: cannot read as a `save_to_disk` dataset ({type(error).__name__}: "
            f"{error})"
        ) from error
    where = str(directory)
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise DataError(
                f"{directory}: no {split!r} split; the saved dataset has {sorted(saved)} "
                "(data.split picks the one training reads)"
            )
        saved, where = saved[split], f"{directory}[{split}]"
    return numbered_rows(saved, location_prefix=f"{where}:row ", id_prefix=f"{directory.name}:")


def import_datasets(source: str) -> ModuleType:
    """The `datasets` library, or a DataError saying how to get it (it is a dependency, but a
    trimmed environment may lack it)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{source}: reading it needs the `datasets` library, which is not installed. "
            "Install it (pip install datasets), or pass .jsonl or .parquet files."
        ) from None
    return datasets
