"""A pathological answer is cut off at the deadline, scores 0, and does not stop later scoring.

The deadline must hold in any thread: Ray runs actor methods outside the main thread, where
math-verify's own `signal.alarm` timeout cannot work.
"""

import time
from concurrent.futures import ThreadPoolExecutor

# Slack above the deadline for killing the helper and the reply round trip on a busy CI box.
SLACK_S = 1.5

PATHOLOGICAL_ANSWERS = {
    # math-verify's LaTeX parser backtracks exponentially on nesting (30 levels take ~4 s).
    "nested_parentheses": "(" * 60 + "1" + ")" * 60,
    # Parses at once; comparing it with the ground truth makes sympy evaluate it, for ever.
    "tower_of_powers": "10^{10^{10}}",
}


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def test_parser_hang_in_the_main_thread_scores_zero_at_the_deadline(impatient_scorer):
    # A first call leaves a started helper behind, so that only the slow call is timed.
    assert impatient_scorer.score("", "\\boxed{1}", "1") == 1.0
    response = f"\\boxed{{{PATHOLOGICAL_ANSWERS['nested_parentheses']}}}"
    score, elapsed = timed(impatient_scorer.score, "", response, "1")
    assert score == 0.0
    assert impatient_scorer.timeout_s <= elapsed < impatient_scorer.timeout_s + SLACK_S


def test_comparison_hang_in_a_worker_thread_scores_zero_at_the_deadline(impatient_scorer):
    assert impatient_scorer.score("", "\\boxed{1}", "1") == 1.0
    response = f"\\boxed{{{PATHOLOGICAL_ANSWERS['tower_of_powers']}}}"
    with ThreadPoolExecutor(max_workers=1) as pool:
        batch, elapsed = pool.submit(
            timed, impatient_scorer.score_batch, [""], [response], ["1"]
        ).result()
    assert batch.scores == [0.0]
    assert batch.statuses == ["timeout"]
    assert batch.n_timeout == 1
    assert impatient_scorer.timeout_s <= elapsed < impatient_scorer.timeout_s + SLACK_S


def test_a_timeout_in_a_batch_costs_only_that_sample_and_scoring_recovers(impatient_scorer):
    responses = [
        "\\boxed{3}",
        f"\\boxed{{{PATHOLOGICAL_ANSWERS['tower_of_powers']}}}",
        "\\boxed{5}",
    ]
    batch = impatient_scorer.score_batch(["", "", ""], responses, ["3", "4", "5"])
    assert batch.scores == [1.0, 0.0, 1.0]
    assert batch.statuses == ["scored", "timeout", "scored"]


def test_comparing_answers_for_a_vote_is_bounded_too(impatient_scorer):
    start = time.perf_counter()
    assert not impatient_scorer.answers_equivalent(PATHOLOGICAL_ANSWERS["tower_of_powers"], "1")
    assert time.perf_counter() - start < impatient_scorer.timeout_s + SLACK_S + 1.0  # + a restart
