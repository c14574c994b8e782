"""`output.storage`: a run's checkpoints and saved stages also kept at a URI that every node
reaches (a path on shared storage, `file://...`, `s3://bucket/prefix`, `gs://...`: anything
`pyarrow.fs` opens, as Ray Train's `storage_path` takes it), so that a resume after the loss of
a node finds what that node's learners wrote (design §8).

The run's outputs directory stays the working copy: every file is written there first, on the
node of whoever writes it (atomically, as without storage), and then uploaded under the same
relative path. A file is uploaded under a temporary name and moved into place, so an interrupted
upload leaves no object under the final name; a checkpoint's `run.pt` is uploaded after its
learners' files, so it marks a complete checkpoint at the URI as it does on disk. On resume, a
file or directory the node does not hold is downloaded (aside, then renamed into place).

S3 options go in the URI's query, as pyarrow reads them
(`s3://bucket/run?region=us-east-1&endpoint_override=host:9000&scheme=http`), and credentials
in the usual environment (`AWS_ACCESS_KEY_ID`, ...).
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from pyarrow import fs

SCHEMES = ("file", "s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
"""The URI schemes `pyarrow.fs` opens; a URI without one is a local (or mounted) path."""
MARKER_FILES = ("config.json", "adapter_config.json")
"""Uploaded last in a directory: what makes a saved stage loadable (`evaluation.checkpoints`)."""


def check_storage_uri(uri: str) -> str:
    """`uri` as `output.storage` takes it, or a ValueError that says what is accepted."""
    scheme = urlsplit(uri).scheme
    if scheme and scheme not in SCHEMES:
        raise ValueError(
            f"{uri!r}: a storage URI's scheme is one of {', '.join(SCHEMES)}, or none for a "
            "path on storage every node mounts"
        )
    return uri


@functools.lru_cache(maxsize=8)
def _open(uri: str) -> tuple[fs.FileSystem, str]:
    if not urlsplit(uri).scheme:
        uri = str(Path(uri).absolute())
    return fs.FileSystem.from_uri(uri)


class StorageMirror:
    """The files under `local_root` (a run's outputs directory) and their copies at `uri`: a
    local path `local_root/a/b` is `uri/a/b` there. Sent to the learners with the calls that
    write or read a checkpoint; it holds two strings."""

    def __init__(self, local_root: str | Path, uri: str):
        self.local_root = Path(local_root)
        """As the writers name their paths (relative ones resolve on each node alike)."""
        self.uri = check_storage_uri(uri)

    def upload(self, local: str | Path) -> None:
        """The file or directory at `local` (under `local_root`) copied to the URI."""
        filesystem, remote = self._remote(local)
        local = Path(local)
        if not local.is_dir():
            filesystem.create_dir(remote.rpartition("/")[0], recursive=True)
            self._upload_file(filesystem, local, remote)
            return
        files = sorted(p for p in local.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name in MARKER_FILES)  # a loadable dir only once whole
        targets = [f"{remote}/{path.relative_to(local).as_posix()}" for path in files]
        for parent in sorted({target.rpartition("/")[0] for target in targets}):
            filesystem.create_dir(parent, recursive=True)  # each once, not once a file
        for path, target in zip(files, targets, strict=True):
            self._upload_file(filesystem, path, target)

    def fetch(self, local: str | Path) -> bool:
        """Download `local` from the URI unless this node holds it; whether it holds it now.
        A path outside `local_root` is left alone (it is not the run's)."""
        local = Path(local)
        if local.exists():
            return True
        if not self._under_root(local):
            return False
        filesystem, remote = self._remote(local)
        kind = filesystem.get_file_info(remote).type
        if kind == fs.FileType.NotFound:
            return False
        local.parent.mkdir(parents=True, exist_ok=True)
        aside = local.with_name(f".{local.name}.fetch-{uuid.uuid4().hex[:8]}")
        fs.copy_files(remote, str(aside), filesystem, fs.LocalFileSystem())  # a file or a tree
        try:
            os.rename(aside, local)
        except OSError:  # a rank on this node fetched it first
            if aside.is_dir():
                shutil.rmtree(aside)
            else:
                aside.unlink()
        return True

    def names(self, local_dir: str | Path) -> list[str]:
        """The names in the URI's copy of `local_dir` (none when it has none)."""
        filesystem, remote = self._remote(local_dir)
        selector = fs.FileSelector(remote, allow_not_found=True)
        return sorted(info.base_name for info in filesystem.get_file_info(selector))

    def exists(self, local: str | Path) -> bool:
        filesystem, remote = self._remote(local)
        return filesystem.get_file_info(remote).type != fs.FileType.NotFound

    def remove(self, local: str | Path) -> None:
        """The URI's copy of `local` (a file or a directory) removed, if there is one."""
        filesystem, remote = self._remote(local)
        kind = filesystem.get_file_info(remote).type
        if kind == fs.FileType.Directory:
            filesystem.delete_dir(remote)
        elif kind == fs.FileType.File:
            filesystem.delete_file(remote)

    def _under_root(self, local: Path) -> bool:
        return local.is_relative_to(self.local_root)

    def _remote(self, local: str | Path) -> tuple[fs.FileSystem, str]:
        local = Path(local)
        if not self._under_root(local):
            raise ValueError(f"{local} is not under the run's outputs directory {self.local_root}")
        filesystem, base = _open(self.uri)
        relative = local.relative_to(self.local_root).as_posix()
        return filesystem, base.rstrip("/") + ("" if relative == "." else f"/{relative}")

    @staticmethod
    def _upload_file(filesystem: fs.FileSystem, local: Path, remote: str) -> None:
        """Written under a temporary name beside `remote` (its directory exists), then moved
        onto it."""
        parent, _, name = remote.rpartition("/")
        aside = f"{parent}/.{name}.upload-{uuid.uuid4().hex[:8]}"
        with local.open("rb") as source, filesystem.open_output_stream(aside) as target:
            shutil.copyfileobj(source, target, 1 << 22)
        filesystem.move(aside, remote)
