"""The errors that scoring raises to users."""

from __future__ import annotations


class RewardError(Exception):
    """Scoring a sample failed for a reason other than a wrong answer."""


class RewardFunctionError(RewardError):
    """A custom `reward.function` raised, or returned something that is not a finite number.

    The message names the function's `package.module:function` path.
    """


class RewardFunctionImportError(RewardFunctionError):
    """A custom `reward.function` could not be imported, or its path is malformed.

    This is a configuration error: it would fail every sample, so batch scoring raises it
    instead of counting it per sample.
    """


class ScoringTimeout(RewardError):
    """Verifying one sample took longer than `reward.timeout_s`; the helper process was killed."""


class HelperProcessError(RewardError):
    """The helper process that verifies answers could not start, or died while scoring."""


class HelperStartError(HelperProcessError):
    """A helper process died before it answered its warm-up call: nothing it imports loads
    (a module that shadows the standard library on its path, a broken install). Every sample
    would fail the same way, so batch scoring raises it instead of scoring them 0."""
