"""Rows as read from one data file, each with where it came from.

Every reader yields `RawRow`s: the row's fields (or why it could not be read) and a location a
user can open, `data/train.jsonl:17` (a JSONL line, as an editor numbers it) or
`data/train.parquet:row 16` (a 0-based row index, as pyarrow and pandas number it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from satseq.data.records import DataError

DATA_FILE_SUFFIXES = (".jsonl", ".parquet")


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


def read_data_file(path: Path) -> Iterator[RawRow]:
    """The rows of a `.jsonl` or `.parquet` file; DataError naming it for any other type."""
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".parquet":
        return read_parquet(path)
    raise DataError(
        f"{path}: unsupported file type {path.suffix!r}; use .jsonl or .parquet (or a "
        "Hugging Face dataset directory or name)"
    )


def read_jsonl(path: Path) -> Iterator[RawRow]:
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


def read_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq  # imported here so that JSONL-only use does not pay for it

    try:
        batches = pq.ParquetFile(path).iter_batches()
    except Exception as error:  # pyarrow raises several types (ArrowInvalid, OSError, ...)
        raise DataError(f"{path}: cannot read as parquet ({error})") from error
    yield from numbered_rows(
        (row for batch in batches for row in batch.to_pylist()),
        location_prefix=f"{path}:row ",
        id_prefix=f"{path.name}:",
    )


def numbered_rows(
    rows: Iterable[Mapping[str, Any]], location_prefix: str, id_prefix: str
) -> Iterator[RawRow]:
    """RawRows for sources whose rows are addressed by a 0-based index (parquet, datasets)."""
    for index, fields in enumerate(rows):
        yield RawRow(f"{location_prefix}{index}", f"{id_prefix}{index}", fields)


def natural_order(paths: Iterable[Path]) -> list[Path]:
    """`paths` sorted with their numbers compared as numbers: subset_2 before subset_10."""
    return sorted(
        paths,
        key=lambda path: [
            int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))
        ],
    )
