"""The one entry point that training and evaluation use to score responses.

A sample's reward, in order:

1. With `format_rule`, a response that breaks the SPO think format scores 0.
2. Otherwise it is the weighted sum of its reward functions' scores, r = Σ_k w_k r_k (TRL's
   `reward_funcs` with `reward_weights`). One function of weight 1 is the default: a custom
   `function`, else the built-in check.
3. The built-in check (`VERIFY`) extracts the answer (last box, then `fallbacks`) and verifies it
   against the ground truth with math-verify: 1 if equal, else 0. No answer found scores 0.

A term that times out or fails adds 0; the sample's status is the worst of its terms'.

Verification and custom functions run in helper processes with a `timeout_s` deadline (see
`satseq.rewards.bounded_process`); this works in any thread, and a timeout scores 0.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from satseq.rewards import verify
from satseq.rewards.bounded_process import BoundedProcessPool
from satseq.rewards.errors import HelperStartError, RewardFunctionImportError, ScoringTimeout
from satseq.rewards.extract import DEFAULT_FALLBACKS, check_fallbacks, extract_answer
from satseq.rewards.format_rules import follows_think_format
from satseq.rewards.plugin import call_reward_function, check_function_path, load_reward_function

logger = logging.getLogger(__name__)

SampleStatus = Literal["scored", "no_answer", "format_violation", "timeout", "failed"]
"""What happened to a sample: `scored` by the verifier or the custom function; every other
status scores 0 (in a weighted sum: that term adds 0)."""

VERIFY = "verify"
"""The built-in check's name among weighted reward functions (`reward.functions`)."""

_SEVERITY: tuple[SampleStatus, ...] = ("scored", "no_answer", "timeout", "failed")


@dataclass(frozen=True)
class BatchScores:
    """The rewards of a batch, with what happened to each sample, for metrics.

    Attributes:
        scores: one reward per sample, in input order.
        statuses: one `SampleStatus` per sample.
        first_error: the first failure's message (it names a custom function's path), or None.
    """

    scores: list[float]
    statuses: list[SampleStatus]
    first_error: str | None = None

    def count(self, status: SampleStatus) -> int:
        return self.statuses.count(status)

    @property
    def n_timeout(self) -> int:
        return self.count("timeout")

    @property
    def n_failed(self) -> int:
        return self.count("failed")

    @property
    def n_no_answer(self) -> int:
        return self.count("no_answer")

    @property
    def n_format_violation(self) -> int:
        return self.count("format_violation")


class _Outcome(NamedTuple):
    score: float
    status: SampleStatus
    error: Exception | None = None  # set when status is "failed"


class RewardScorer:
    """Scores responses against ground truths; picklable, so it can be shipped to Ray actors.

    Helper processes start on first use in the process that scores, and are reused; call
    `close()` (or use `with`) to stop them early, otherwise they stop with the process.

    Args:
        function: "package.module:function" of a custom reward (see `satseq.rewards.plugin`),
            or None for the built-in math-verify check.
        functions: several reward functions with their weights, `(path or VERIFY, weight)`;
            the reward is the weighted sum. Given, it replaces `function`.
        fallbacks: answer extractors to try, in order, when a response has no `\\boxed{}`;
            names from `satseq.rewards.extract.FALLBACKS`. Empty means boxed answers only.
        allow_percent: read "X%" as X/100 as well as X (so 10% = 0.1); otherwise only as X.
        format_rule: score 0 unless the response follows the SPO think format.
        timeout_s: deadline for verifying one sample or one custom-function call.
    """

    def __init__(
        self,
        *,
        function: str | None = None,
        functions: Sequence[tuple[str, float]] = (),
        fallbacks: Iterable[str] = DEFAULT_FALLBACKS,
        allow_percent: bool = False,
        format_rule: bool = False,
        timeout_s: float = 5.0,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be positive, got {timeout_s}")
        if function is not None and functions:
            raise ValueError("give reward.function or reward.functions, not both")
        terms = functions or [(function or VERIFY, 1.0)]
        key = "reward.functions[{}].function" if functions else "reward.function"
        self.terms: tuple[tuple[str | None, float], ...] = tuple(
            (None if path == VERIFY else check_function_path(path, key.format(k)), float(weight))
            for k, (path, weight) in enumerate(terms)
        )
        self.fallbacks = check_fallbacks(fallbacks)
        self.allow_percent = allow_percent
        self.format_rule = format_rule
        self.timeout_s = timeout_s
        self._pool: BoundedProcessPool | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"RewardScorer(terms={self.terms!r}, fallbacks={self.fallbacks!r}, "
            f"allow_percent={self.allow_percent}, format_rule={self.format_rule}, "
            f"timeout_s={self.timeout_s})"
        )

    # Helper processes and locks stay behind when the scorer is pickled; the copy starts its own.
    def __getstate__(self) -> dict[str, Any]:
        return {
            key: value for key, value in vars(self).items() if key not in ("_pool", "_pool_lock")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._pool = None
        self._pool_lock = threading.Lock()

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the helper processes; the scorer starts new ones if it is used again."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def extract_answer(self, response: str) -> str | None:
        """The response's final answer with this scorer's fallbacks, or None (for voting)."""
        return extract_answer(response, self.fallbacks)

    def answers_equivalent(self, first: str, second: str) -> bool:
        """Whether two extracted answers are mathematically the same (symmetric; for voting).

        A timeout or a helper failure counts as "not equivalent" and is logged.
        """
        try:
            return self._helpers().call(
                verify.answers_equivalent,
                first,
                second,
                self.allow_percent,
                timeout_s=self.timeout_s,
            )
        except Exception as exc:  # a vote must not fail on one odd answer
            logger.warning(
                "comparing answers %s and %s failed: %s", _preview(first), _preview(second), exc
            )
            return False

    def score(self, prompt: str, response: str, ground_truth: str, **meta: Any) -> float:
        """The reward of one response.

        A timeout scores 0 (and is logged); anything else that goes wrong raises.

        Raises:
            RewardFunctionImportError: the custom function could not be imported.
            RewardFunctionError: the custom function raised or returned a non-number.
            HelperProcessError: the helper process could not start or died.
            RewardError: `meta` could not be pickled for the helper process.
        """
        outcome = self._score_sample(prompt, response, ground_truth, meta)
        if outcome.status == "failed":
            raise outcome.error
        return outcome.score

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[str],
        metas: Sequence[Mapping[str, Any]] | None = None,
    ) -> BatchScores:
        """The rewards of a batch of samples, given as parallel sequences.

        A sample that times out or fails scores 0 and is counted; one bad sample never stops the
        batch. Only a custom function that cannot be imported, or a helper process that cannot
        start, raises, since either would fail them all.

        Raises:
            RewardFunctionImportError: the custom function could not be imported.
            HelperStartError: a helper process died before it answered its warm-up.
            ValueError: the sequences differ in length.
        """
        metas = [{}] * len(responses) if metas is None else metas
        lengths = {len(prompts), len(responses), len(ground_truths), len(metas)}
        if len(lengths) != 1:
            raise ValueError(
                f"score_batch needs sequences of one length, got {len(prompts)} prompts, "
                f"{len(responses)} responses, {len(ground_truths)} ground truths, "
                f"{len(metas)} metas"
            )
        outcomes = [
            self._score_sample(prompt, response, ground_truth, meta)
            for prompt, response, ground_truth, meta in zip(
                prompts, responses, ground_truths, metas, strict=True
            )
        ]
        errors = [outcome.error for outcome in outcomes if outcome.status == "failed"]
        if errors:
            logger.warning(
                "%d of %d samples failed to score; the first: %s",
                len(errors),
                len(outcomes),
                errors[0],
            )
        return BatchScores(
            scores=[outcome.score for outcome in outcomes],
            statuses=[outcome.status for outcome in outcomes],
            first_error=str(errors[0]) if errors else None,
        )

    def _score_sample(
        self, prompt: str, response: str, ground_truth: str, meta: Mapping[str, Any]
    ) -> _Outcome:
        if self.format_rule and not follows_think_format(response):
            return _Outcome(0.0, "format_violation")
        outcomes = [
            self._score_term(function, prompt, response, ground_truth, meta)
            for function, _ in self.terms
        ]
        worst = max(outcomes, key=lambda outcome: _SEVERITY.index(outcome.status))
        score = sum(  # r = Σ_k w_k r_k; a term that did not score adds 0
            weight * outcome.score
            for (_, weight), outcome in zip(self.terms, outcomes, strict=True)
            if outcome.status == "scored"
        )
        return _Outcome(float(score), worst.status, worst.error)

    def _score_term(
        self,
        function: str | None,
        prompt: str,
        response: str,
        ground_truth: str,
        meta: Mapping[str, Any],
    ) -> _Outcome:
        """One reward function's score: `function` (a custom path) or the built-in check."""
        if function is not None:
            target: Callable[..., Any] = call_reward_function
            args: tuple[Any, ...] = (function, prompt, response, ground_truth, dict(meta))
            what = f"reward.function {function!r}"
        else:
            answer = self.extract_answer(response)
            if answer is None:
                return _Outcome(0.0, "no_answer")
            target = verify.answer_matches
            args = (answer, str(ground_truth), self.allow_percent)
            what = f"verifying answer {_preview(answer)} against {_preview(str(ground_truth))}"
        try:
            score = float(self._helpers().call(target, *args, timeout_s=self.timeout_s))
        except (RewardFunctionImportError, HelperStartError):  # every sample would fail so
            raise
        except ScoringTimeout:
            logger.warning("%s timed out after %g s; scored 0", what, self.timeout_s)
            return _Outcome(0.0, "timeout")
        except Exception as exc:  # one bad sample must not stop the batch
            return _Outcome(0.0, "failed", exc)
        return _Outcome(score, "scored")

    def _helpers(self) -> BoundedProcessPool:
        with self._pool_lock:
            if self._pool is None:
                paths = tuple(function for function, _ in self.terms)
                self._pool = BoundedProcessPool(functools.partial(_warm_up, paths))
            return self._pool


def _warm_up(functions: tuple[str | None, ...]) -> None:
    """Import each custom function (None: build the verifier) before a helper's first deadline
    starts: a heavy import would otherwise time out, be killed, and be retried forever."""
    for function in functions:
        if function is None:
            verify.warm_up()
        else:
            load_reward_function(function)


def _preview(text: str, limit: int = 80) -> str:
    """`text` for a log line, cut to `limit` characters."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
