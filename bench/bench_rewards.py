"""Reward scoring throughput on one core: the scorer against baselines measured in the same run.

    python bench/bench_rewards.py [--n-prompts 250] [--responses-per-prompt 8] [--repeats 3]
                                  [--core 0]

The workload is what a GRPO step scores: short responses ending in a boxed integer, fraction or
decimal, G responses per prompt, about half of them right, and up to a quarter written in
another form than the ground truth ("\\frac{1}{2}" against "0.5").

Methods, each over the same responses:

- `string equality`: the extracted answer compared as text (fast, but wrong on other forms);
- `math-verify, as usually called`: `verify(parse(ground truth), parse(full response))` in this
  process, with math-verify's own signal.alarm timeouts (main thread only);
- `extracted answer, signal timeouts`: our extraction, then math-verify on the boxed answer with
  its signal.alarm timeouts: what the timeout would cost if we only ever scored in main threads;
- `answer_matches in-process`: our extraction and math-verify call (which caches a ground truth's
  parse across its responses), with no deadline at all;
- `RewardScorer.score_batch`: the same work in a helper process under a deadline, which is what
  training uses; its gap to the line above is the cost of the timeout mechanism.

The process (and so its helper processes) is pinned to one core. Each method runs with cold
caches, `--repeats` times, and the fastest run is reported.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable
from fractions import Fraction

from math_verify import parse, verify
from sympy.core.cache import clear_cache

from satseq.rewards import RewardScorer, extract_answer
from satseq.rewards import verify as reward_verify


def make_workload(
    n_prompts: int, responses_per_prompt: int, seed: int
) -> tuple[list[str], list[str], list[bool]]:
    """Responses, their ground truths, and whether each response is right."""
    rng = random.Random(seed)
    responses, ground_truths, right = [], [], []
    for _ in range(n_prompts):
        kind = rng.choice(["integer", "fraction", "decimal"])
        if kind == "integer":
            truth = Fraction(rng.randint(-999, 999))
        else:
            truth = Fraction(rng.randint(1, 99), rng.choice([2, 4, 5, 8, 10, 20, 25]))
        ground_truth = _write(truth, kind)
        for _ in range(responses_per_prompt):
            is_right = rng.random() < 0.5
            value = truth if is_right else truth + rng.choice([-3, -1, 1, 2, Fraction(1, 2)])
            form = kind if rng.random() < 0.75 else rng.choice(["fraction", "decimal"])
            steps = f"We compute {rng.randint(2, 99)} * {rng.randint(2, 99)} and simplify."
            responses.append(f"{steps} So the result is \\boxed{{{_write(value, form)}}}.")
            ground_truths.append(ground_truth)
            right.append(is_right)
    return responses, ground_truths, right


def _write(value: Fraction, form: str) -> str:
    if value.denominator == 1 and form == "integer":
        return str(value.numerator)
    if form == "decimal":
        return f"{float(value):g}"
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def string_equality(responses: list[str], ground_truths: list[str]) -> list[float]:
    return [
        float(extract_answer(response) == truth)
        for response, truth in zip(responses, ground_truths, strict=True)
    ]


def math_verify_as_usually_called(responses: list[str], ground_truths: list[str]) -> list[float]:
    return [
        float(verify(parse(f"${truth}$"), parse(response)))
        for response, truth in zip(responses, ground_truths, strict=True)
    ]


def extracted_with_signal_timeouts(responses: list[str], ground_truths: list[str]) -> list[float]:
    return [
        float(verify(parse(f"\\boxed{{{truth}}}"), parse(f"\\boxed{{{extract_answer(response)}}}")))
        for response, truth in zip(responses, ground_truths, strict=True)
    ]


def answer_matches_in_process(responses: list[str], ground_truths: list[str]) -> list[float]:
    return [
        float(reward_verify.answer_matches(extract_answer(response), truth, allow_percent=False))
        for response, truth in zip(responses, ground_truths, strict=True)
    ]


Method = Callable[[list[str], list[str]], list[float]]


def cold_in_process(method: Method) -> Callable[[], Method]:
    """A setup that empties this process's caches, as a fresh helper process starts empty."""

    def setup() -> Method:
        clear_cache()  # sympy's expression cache
        reward_verify.parse_answer.cache_clear()
        return method

    return setup


class FreshScorer:
    """A setup that starts a new RewardScorer and its helper outside the timed region."""

    def __init__(self) -> None:
        self.scorer: RewardScorer | None = None
        self.startup_s: list[float] = []

    def __call__(self) -> Method:
        self.close()
        self.scorer = scorer = RewardScorer(timeout_s=5.0)
        start = time.perf_counter()
        scorer.score("", "\\boxed{1}", "1")
        self.startup_s.append(time.perf_counter() - start)

        def score_batch(responses: list[str], ground_truths: list[str]) -> list[float]:
            return scorer.score_batch([""] * len(responses), responses, ground_truths).scores

        return score_batch

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()


def best_of(
    repeats: int, setup: Callable[[], Method], responses: list[str], ground_truths: list[str]
) -> tuple[float, list[float]]:
    """The fastest of `repeats` cold runs (the least disturbed by other load on the core)."""
    timings = []
    for _ in range(repeats):
        method = setup()
        start = time.perf_counter()
        scores = method(responses, ground_truths)
        timings.append(time.perf_counter() - start)
    return min(timings), scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-prompts", type=int, default=250)
    parser.add_argument("--responses-per-prompt", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})  # helpers started from here inherit the pinning

    responses, ground_truths, right = make_workload(
        args.n_prompts, args.responses_per_prompt, args.seed
    )
    n = len(responses)
    fresh_scorer = FreshScorer()
    setups = {
        "string equality": cold_in_process(string_equality),
        "math-verify, as usually called": cold_in_process(math_verify_as_usually_called),
        "extracted answer, signal timeouts": cold_in_process(extracted_with_signal_timeouts),
        "answer_matches in-process": cold_in_process(answer_matches_in_process),
        "RewardScorer.score_batch": fresh_scorer,
    }
    results = {
        name: best_of(args.repeats, setup, responses, ground_truths)
        for name, setup in setups.items()
    }
    fresh_scorer.close()

    scorer_s = results["RewardScorer.score_batch"][0]
    print(
        f"{n} responses ({sum(right)} right), one core (core {args.core}), best of {args.repeats}"
    )
    header = ("method", "seconds", "answers/s", "time vs scorer", "agrees with truth")
    print(f"{header[0]:34} {header[1]:>8} {header[2]:>10} {header[3]:>15} {header[4]:>18}")
    for name, (seconds, scores) in results.items():
        agreement = sum(
            (score == 1.0) == is_right for score, is_right in zip(scores, right, strict=True)
        )
        print(
            f"{name:34} {seconds:8.3f} {n / seconds:10.0f} {seconds / scorer_s:14.2f}x "
            f"{agreement / n:18.1%}"
        )
    in_process_s = results["answer_matches in-process"][0]
    print(
        f"timeout mechanism (helper process round trip): "
        f"{(scorer_s - in_process_s) / n * 1e6:.0f} us per answer, "
        f"{scorer_s / in_process_s:.2f}x the in-process time; "
        f"helper startup {min(fresh_scorer.startup_s):.2f} s "
        "(paid once per process, and after each timeout by the replacement)"
    )


if __name__ == "__main__":
    main()
