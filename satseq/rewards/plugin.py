"""Custom reward functions named in the config as `reward.function: "package.module:function"`.

The function's signature is::

    def my_reward(prompt: str, response: str, ground_truth: str, **meta) -> float: ...

`meta` holds the per-sample keyword arguments the caller passed to `RewardScorer.score` (or the
`metas` of `score_batch`); accept `**meta` so that new fields do not break the function. Return
a finite number; built-in scores are 0 or 1.

The function runs in the scorer's helper process (see `satseq.rewards.bounded_process`), under
the same deadline as the built-in verifier, so a hang costs one sample, not the run. It is
imported there on first use, with the scoring process's `sys.path`; on a Ray cluster its package
must be installed on (or shipped to, e.g. with `runtime_env`) every worker that scores.
"""

from __future__ import annotations

import importlib
import math
import re
import traceback
from collections.abc import Callable
from functools import cache
from numbers import Real
from typing import Any

from satseq.rewards.errors import RewardFunctionError, RewardFunctionImportError

RewardFunction = Callable[..., float]

_DOTTED_NAME = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_FUNCTION_PATH = re.compile(rf"(?P<module>{_DOTTED_NAME}):(?P<attribute>{_DOTTED_NAME})")


def check_function_path(path: str, key: str = "reward.function") -> str:
    """Return `path` if it has the form `package.module:function`, else raise naming `key`.

    Raises:
        RewardFunctionImportError: the path is malformed.
    """
    if not _FUNCTION_PATH.fullmatch(path.strip()):
        raise RewardFunctionImportError(
            f"{key} {path!r} is not of the form 'package.module:function' "
            "(for example 'my_rewards.math:score')"
        )
    return path.strip()


@cache  # import once per helper process; a failed import is not cached and is retried
def load_reward_function(path: str) -> RewardFunction:
    """Import the function that `path` ("package.module:function") names.

    Raises:
        RewardFunctionImportError: the path is malformed, the module does not import, or the
            attribute is missing or not callable.
    """
    module_name, attribute_path = check_function_path(path).split(":")
    try:
        target: Any = importlib.import_module(module_name)
        for attribute in attribute_path.split("."):
            target = getattr(target, attribute)
    except Exception as exc:
        raise RewardFunctionImportError(
            f"reward.function {path!r} could not be imported: {type(exc).__name__}: {exc}. "
            "Check the spelling, and that the module is importable on every worker that "
            "scores (installed, or on PYTHONPATH)."
        ) from exc
    if not callable(target):
        raise RewardFunctionImportError(
            f"reward.function {path!r} names a {type(target).__name__}, not a function"
        )
    return target


def call_reward_function(
    path: str, prompt: str, response: str, ground_truth: str, meta: dict[str, Any]
) -> float:
    """Score one sample with the custom function at `path`.

    Raises:
        RewardFunctionImportError: the function could not be imported.
        RewardFunctionError: the function raised, or returned something other than a finite
            number.
    """
    function = load_reward_function(path)
    try:
        score = function(prompt, response, ground_truth, **meta)
    except Exception as exc:
        # The traceback text goes into the message: the exception object itself stays in the
        # helper process, and only this error travels back to the caller.
        raise RewardFunctionError(
            f"reward.function {path!r} raised {type(exc).__name__}: {exc}\n"
            + "".join(traceback.format_exception(exc))
        ) from None
    if not isinstance(score, Real) or not math.isfinite(score):
        raise RewardFunctionError(
            f"reward.function {path!r} returned {score!r} ({type(score).__name__}); "
            "it must return a finite number"
        )
    return float(score)
