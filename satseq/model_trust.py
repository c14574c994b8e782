"""Which model directories may run their own Python code (`trust_remote_code`): a model whose
architecture ships with it (`auto_map` in its config.json) loads only where its agent says
`team.agents[i].trust_remote_code: true`.

The decision is a list of directories in one environment variable, `SATSEQ_TRUST_REMOTE_CODE`,
set by the command before Ray starts and handed to every Ray worker (`launch.connection`), so the
learners, both engines, evaluation and serving read the same answer for a model, each at its own
load: a directory is trusted when it lies inside a listed one (a run's `agent_<name>/` covers
every stage saved there).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TRUSTED_ENV = "SATSEQ_TRUST_REMOTE_CODE"


def trusted_directories() -> list[Path]:
    value = os.environ.get(TRUSTED_ENV, "")
    return [Path(part) for part in value.split(os.pathsep) if part]


def trusts(path: str | Path) -> bool:
    """Whether the model at `path` may run its own code."""
    path = Path(path).expanduser().resolve()
    return any(path == root or root in path.parents for root in trusted_directories())


def trust(directories: Iterable[str | Path]) -> None:
    """Add `directories` to this process's trusted ones (and so to every Ray worker started
    after: `launch.connection.connect` hands the variable on)."""
    known = trusted_directories()
    added = [Path(d).expanduser().resolve() for d in directories]
    os.environ[TRUSTED_ENV] = os.pathsep.join(str(d) for d in dict.fromkeys(known + added))
