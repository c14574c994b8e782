"""Load math problems from a JSONL file, a parquet file, or a Hugging Face dataset name.

`load_problems` reads rows, picks the row format (from the first readable row, or from an
explicit field map; see `satseq.data.formats`) and converts every row to a MathProblem. A bad
row raises a DataError that names the file and line (JSONL) or row index (parquet, Hub), unless
`skip_bad_rows` is set, in which case it is counted and reported in `LoadedProblems.skipped_rows`.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from satseq.data.formats import BadRow, RowFormat, detect_format, format_from_field_map
from satseq.data.records import DataError, LoadedProblems, MathProblem

LOCAL_FILE_SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class RawRow:
    """One row as read, before format conversion.

    `location` points a user at it ("data/train.jsonl:17", "data/train.parquet:row 16");
    `default_id` becomes the problem_id when the row has none. `fields` is None when the row
    could not even be read, and `read_error` then says why.
    """

    location: str
    default_id: str
    fields: Mapping[str, Any] | None
    read_error: str | None = None


def load_problems(
    source: str | Path,
    split: str = "train",
    field_map: Mapping[str, str] | None = None,
    skip_bad_rows: bool = False,
) -> LoadedProblems:
    """Load problems from `source`: a `.jsonl` or `.parquet` path, a directory of them (read in
    natural file-name order), or a Hugging Face dataset name.

    `split` is used for Hugging Face datasets only (a file is one split already). A dataset name
    may carry a config after a colon, e.g. `open-r1/DAPO-Math-17k-Processed:all`.
    `field_map` overrides format detection, e.g. `{"problem": "question",
    "answer": "reward_model.ground_truth"}`.
    """
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


def read_rows(source: str | Path, split: str = "train") -> Iterator[RawRow]:
    """Rows of a local file (by suffix), of every data file in a local directory, or, for a name
    that is not a local path, of a Hub dataset."""
    path = Path(source).expanduser()
    if path.is_dir():
        return _read_directory(path)
    if path.exists() or path.suffix in LOCAL_FILE_SUFFIXES or path.is_absolute():
        if not path.exists():
            raise DataError(f"{source}: file not found")
        if path.suffix == ".jsonl":
            return _read_jsonl(path)
        if path.suffix == ".parquet":
            return _read_parquet(path)
        raise DataError(
            f"{source}: unsupported file type {path.suffix!r}; use .jsonl or .parquet, or a "
            "Hugging Face dataset name"
        )
    return _read_hub_dataset(str(source), split)


def _read_directory(directory: Path) -> Iterator[RawRow]:
    """The rows of every .jsonl/.parquet file directly in `directory`, files in natural order
    (subset_2 before subset_10), as the seeds pass the subsets `satseq offline-values split`
    wrote; each row's location still names its own file."""
    files = sorted(
        (f for f in directory.iterdir() if f.is_file() and f.suffix in LOCAL_FILE_SUFFIXES),
        key=lambda f: [
            int(part) if part.isdigit() else part for part in re.split(r"(\d+)", f.name)
        ],
    )
    if not files:
        raise DataError(f"{directory}: a directory with no .jsonl or .parquet files in it")
    return itertools.chain.from_iterable(read_rows(f) for f in files)


def _detect_format_at(row: RawRow) -> RowFormat:
    try:
        return detect_format(row.fields.keys())
    except DataError as error:
        raise DataError(f"{row.location}: {error}") from None


def _read_jsonl(path: Path) -> Iterator[RawRow]:
    # Bytes go to json.loads as they are: it detects UTF-8/16/32 and a BOM by itself.
    with path.open("rb") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue  # blank lines (a trailing newline, say) are not rows
            location = f"{path}:{line_number}"
            default_id = f"{path.name}:{line_number}"
            try:
                fields = json.loads(line)
            except json.JSONDecodeError as error:
                yield RawRow(location, default_id, None, f"invalid JSON ({error.msg})")
                continue
            except UnicodeDecodeError:
                yield RawRow(location, default_id, None, "not valid UTF-8 text")
                continue
            if not isinstance(fields, dict):
                reason = f"expected a JSON object, got {type(fields).__name__}"
                yield RawRow(location, default_id, None, reason)
                continue
            yield RawRow(location, default_id, fields)


def _read_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq  # imported here so that JSONL-only use does not pay for it

    try:
        batches = pq.ParquetFile(path).iter_batches()
    except Exception as error:  # pyarrow raises several types (ArrowInvalid, OSError, ...)
        raise DataError(f"{path}: cannot read as parquet ({error})") from error
    yield from _numbered_rows(
        (row for batch in batches for row in batch.to_pylist()),
        location_prefix=f"{path}:row ",
        id_prefix=f"{path.name}:",
    )


def _read_hub_dataset(source: str, split: str) -> Iterator[RawRow]:
    name, _, config = source.partition(":")
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{source}: not a local file, so it was taken as a Hugging Face dataset name, but the "
            "optional `datasets` library is not installed. Install it (pip install datasets), or "
            "pass a local .jsonl or .parquet file."
        ) from None
    try:
        dataset = datasets.load_dataset(name, config or None, split=split)
    except Exception as error:  # the Hub client raises many types: network, auth, not found, ...
        raise DataError(
            f"cannot load Hugging Face dataset {name!r} (split {split!r}): "
            f"{type(error).__name__}: {error}. Check the name and "
            "split, and that the Hub is reachable (offline, only datasets already in the local "
            "cache load); or pass a local .jsonl or .parquet file."
        ) from error
    return _numbered_rows(dataset, location_prefix=f"{name}[{split}]:row ", id_prefix=f"{name}:")


def _numbered_rows(
    rows: Iterable[Mapping[str, Any]], location_prefix: str, id_prefix: str
) -> Iterator[RawRow]:
    """RawRows for sources whose rows are addressed by a 0-based index (parquet, the Hub)."""
    for index, fields in enumerate(rows):
        yield RawRow(f"{location_prefix}{index}", f"{id_prefix}{index}", fields)
