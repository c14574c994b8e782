"""Load math problems from JSONL and parquet files, dataset directories (`save_to_disk` output,
or a dataset's files as on the Hugging Face Hub), Hugging Face dataset names, or a list of these.

`load_problems` reads rows, picks each source's row format (from its first readable row, or from
an explicit field map; see `satseq.data.formats`) and converts every row to a MathProblem. A bad
row raises a DataError that names the file and line (JSONL) or row index (parquet, datasets),
unless `skip_bad_rows` is set, in which case it is counted and reported in
`LoadedProblems.skipped_rows`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from satseq.data.directories import import_datasets, read_dataset_directory
from satseq.data.formats import BadRow, RowFormat, detect_format, format_from_field_map
from satseq.data.records import DataError, LoadedProblems, MathProblem
from satseq.data.rows import DATA_FILE_SUFFIXES, RawRow, numbered_rows, read_data_file

Source = str | Path


def load_problems(
    source: Source | Sequence[Source],
    split: str = "train",
    field_map: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> LoadedProblems:
    """Load problems from `source`, or from each of a list of sources in turn: a `.jsonl` or
    `.parquet` file, a dataset directory (`satseq.data.directories`), or a Hugging Face dataset
    name. Each source's format is detected on its own (verl's parquet files and MATH-500 may be
    listed together).

    `split` is used for dataset directories and names (a file is one split already). A dataset
    name or directory may carry a config after a colon, e.g.
    `open-r1/DAPO-Math-17k-Processed:all`. `field_map` overrides format detection, e.g.
    `{"problem": "question", "answer": "reward_model.ground_truth"}`.
    """
    sources = [source] if isinstance(source, str | Path) else list(source)
    if not sources:
        raise DataError("no data sources: give a file, a directory or a dataset name")
    loaded = [_load_source(one, split, field_map, skip_bad_rows) for one in sources]
    if len(loaded) == 1:
        return loaded[0]
    format_names = list(dict.fromkeys(part.format_name for part in loaded))
    return LoadedProblems(
        source=", ".join(part.source for part in loaded),
        format_name=", ".join(format_names),
        problems=[problem for part in loaded for problem in part.problems],
        skipped_rows=[message for part in loaded for message in part.skipped_rows],
    )


def _load_source(
    source: Source, split: str, field_map: Mapping[str, str] | None, skip_bad_rows: bool
) -> LoadedProblems:
    row_format = format_from_field_map(field_map) if field_map else None
    problems: list[MathProblem] = []
    skipped_rows: list[str] = []
    num_rows = 0
    for row in read_rows(source, split):
        num_rows += 1
        try:
            if row.fields is None:
                raise BadRow(row.read_error)
            if row_format is None:
                row_format = _detect_format_at(row)
            problems.append(row_format.to_problem(row.fields, row.default_id))
        except BadRow as bad_row:
            # A row that could not be read has no fields, so the format has nothing to say on it.
            read = row_format is not None and row.fields is not None
            format_note = f" (format {row_format.name})" if read else ""
            message = f"{row.location}: {bad_row}{format_note}"
            if not skip_bad_rows:
                raise DataError(
                    f"{message}. Fix or remove the row, or skip bad rows (skip_bad_rows=True)."
                ) from None
            skipped_rows.append(message)
    if num_rows == 0:
        raise DataError(f"{source}: no rows; the dataset is empty")
    if not problems:
        raise DataError(
            f"{source}: no problems to load; all {num_rows} rows were bad, the first: "
            f"{skipped_rows[0]}"
        )
    return LoadedProblems(
        source=str(source),
        format_name=row_format.name,
        problems=problems,
        skipped_rows=skipped_rows,
    )


def read_rows(source: Source, split: str = "train") -> Iterator[RawRow]:
    """Rows of a local file (by suffix), of one split of a dataset directory, or, for a name that
    is not a local path, of a Hub dataset."""
    path = Path(source).expanduser()
    directory, _, config = str(path).rpartition(":")
    if path.is_dir():
        return read_dataset_directory(path, split, None)
    if directory and Path(directory).is_dir():  # DIR:CONFIG
        return read_dataset_directory(Path(directory), split, config)
    if path.exists() or path.suffix in DATA_FILE_SUFFIXES or path.is_absolute():
        if not path.exists():
            raise DataError(f"{source}: file not found")
        return read_data_file(path)
    return _read_hub_dataset(str(source), split)


def _detect_format_at(row: RawRow) -> RowFormat:
    try:
        return detect_format(row.fields.keys())
    except DataError as error:
        raise DataError(f"{row.location}: {error}") from None


def _read_hub_dataset(source: str, split: str) -> Iterator[RawRow]:
    name, _, config = source.partition(":")
    datasets = import_datasets(f"{source} (not a local path, so taken as a Hugging Face dataset)")
    try:
        dataset = datasets.load_dataset(name, config or None, split=split)
    except Exception as error:  # the Hub client raises many types: network, auth, not found, ...
        raise DataError(
            f"cannot load Hugging Face dataset {name!r} (split {split!r}): "
            f"{type(error).__name__}: {error}. Check the name and "
            "split, and that the Hub is reachable (offline, only datasets already in the local "
            "cache load); or pass a local .jsonl or .parquet file."
        ) from error
    return numbered_rows(dataset, location_prefix=f"{name}[{split}]:row ", id_prefix=f"{name}:")
