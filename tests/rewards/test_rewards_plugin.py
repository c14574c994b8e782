"""Custom reward functions: `reward.function: "package.module:function"`.

The tests write their own reward module into a temporary directory on sys.path, as a user's
package would be installed on the workers.
"""

import pickle
import textwrap
import threading
import time

import pytest

from satseq.rewards import (
    RewardFunctionError,
    RewardFunctionImportError,
    RewardScorer,
)

USER_REWARDS = textwrap.dedent(
    """
    import time


    def contains_truth(prompt, response, ground_truth, **meta):
        '''1 if the ground truth appears in the response, plus a per-sample bonus.'''
        return float(ground_truth in response) + meta.get("bonus", 0.0)


    def explodes(prompt, response, ground_truth, **meta):
        if "bad" in response:
            raise ZeroDivisionError("cannot score this one")
        return 1.0


    def answers_yes(prompt, response, ground_truth, **meta):
        return "yes"


    def sleeps_when_asked(prompt, response, ground_truth, **meta):
        if response == "take your time":
            time.sleep(60)
        return 1.0
    """
)


@pytest.fixture(scope="module", autouse=True)
def user_rewards_on_sys_path(tmp_path_factory):
    package_dir = tmp_path_factory.mktemp("user_code")
    (package_dir / "user_rewards.py").write_text(USER_REWARDS)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(package_dir))
        yield


def test_custom_function_scores_with_meta():
    with RewardScorer(function="user_rewards:contains_truth", timeout_s=10.0) as scorer:
        assert scorer.score("What is 6*7?", "It is 42.", "42") == 1.0
        assert scorer.score("What is 6*7?", "It is 41.", "42", bonus=0.25) == 0.25
        batch = scorer.score_batch(
            ["q1", "q2"], ["says 7", "says 8"], ["7", "7"], metas=[{}, {"bonus": 0.5}]
        )
    assert batch.scores == [1.0, 0.5]
    assert batch.statuses == ["scored", "scored"]


def test_unpicklable_meta_fails_that_sample_only():
    with RewardScorer(function="user_rewards:contains_truth", timeout_s=10.0) as scorer:
        batch = scorer.score_batch(
            ["", ""], ["7", "7"], ["7", "7"], metas=[{"lock": threading.Lock()}, {}]
        )
    assert batch.statuses == ["failed", "scored"]
    assert "must be picklable" in batch.first_error


def test_custom_function_works_after_pickling_in_another_thread():
    shipped = pickle.loads(pickle.dumps(RewardScorer(function="user_rewards:contains_truth")))
    results = []
    thread = threading.Thread(target=lambda: results.append(shipped.score("", "x=3", "3")))
    thread.start()
    thread.join()
    shipped.close()
    assert results == [1.0]


def test_raising_function_names_its_path_and_counts_as_failed_in_a_batch():
    with RewardScorer(function="user_rewards:explodes", timeout_s=10.0) as scorer:
        with pytest.raises(
            RewardFunctionError, match=r"'user_rewards:explodes' raised ZeroDivisionError"
        ):
            scorer.score("", "a bad sample", "1")
        batch = scorer.score_batch(["", "", ""], ["good", "bad", "good"], ["1", "1", "1"])
    assert batch.scores == [1.0, 0.0, 1.0]
    assert batch.n_failed == 1
    assert "user_rewards:explodes" in batch.first_error
    assert "cannot score this one" in batch.first_error


def test_non_number_return_is_a_failure():
    scorer = RewardScorer(function="user_rewards:answers_yes", timeout_s=10.0)
    with (
        scorer,
        pytest.raises(RewardFunctionError, match=r"returned 'yes' \(str\); .* finite number"),
    ):
        scorer.score("", "response", "1")


@pytest.mark.parametrize(
    ("path", "cause"),
    [
        ("user_rewards:no_such_function", "AttributeError"),
        ("no_such_package.rewards:score", "ModuleNotFoundError"),
    ],
)
def test_unimportable_function_raises_naming_the_path(path, cause):
    with RewardScorer(function=path, timeout_s=10.0) as scorer:
        with pytest.raises(
            RewardFunctionImportError, match=f"{path!r} could not be imported: {cause}"
        ):
            scorer.score("", "response", "1")
        # It would fail every sample, so a batch raises rather than counting.
        with pytest.raises(RewardFunctionImportError, match=path):
            scorer.score_batch([""], ["response"], ["1"])


@pytest.mark.parametrize("path", ["user_rewards.contains_truth", "user_rewards:", "a b:c"])
def test_malformed_path_is_rejected_at_construction(path):
    with pytest.raises(RewardFunctionImportError, match=r"'package\.module:function'"):
        RewardScorer(function=path)


def test_slow_function_times_out_and_scores_zero():
    with RewardScorer(function="user_rewards:sleeps_when_asked", timeout_s=0.5) as scorer:
        assert scorer.score("", "be quick", "") == 1.0  # a ready helper: time only the slow call
        start = time.perf_counter()
        batch = scorer.score_batch([""], ["take your time"], [""])
        elapsed = time.perf_counter() - start
    assert batch.scores == [0.0]
    assert batch.statuses == ["timeout"]
    assert 0.5 <= elapsed < 0.5 + 1.5


def test_weighted_functions_score_their_weighted_sum():
    functions = [("user_rewards:contains_truth", 0.5), ("verify", 2.0)]
    with RewardScorer(functions=functions, timeout_s=10.0) as scorer:
        assert scorer.score("6*7?", "It is \\boxed{42}", "42") == 0.5 * 1 + 2.0 * 1
        assert scorer.score("6*7?", "It is \\boxed{41}", "42", bonus=0.25) == 0.5 * 0.25
        batch = scorer.score_batch(["6*7?"] * 2, ["no number", "42"], ["42"] * 2)
        # the built-in term: no answer in the first (its status), 42 by a fallback in the second
        assert batch.scores == [0.0, 0.5 + 2.0]
        assert batch.statuses == ["no_answer", "scored"]


def test_a_failing_term_adds_zero_and_marks_the_sample():
    functions = [("user_rewards:explodes", 1.0), ("verify", 3.0)]
    with RewardScorer(functions=functions, timeout_s=10.0) as scorer:
        batch = scorer.score_batch(["q", "q"], ["bad \\boxed{7}", "good \\boxed{7}"], ["7", "7"])
    assert batch.scores == [3.0, 4.0]
    assert batch.statuses == ["failed", "scored"]
    assert "cannot score this one" in batch.first_error


def test_weighted_functions_name_the_bad_entry():
    with pytest.raises(RewardFunctionImportError, match=r"reward\.functions\[1\]\.function"):
        RewardScorer(functions=[("verify", 1.0), ("no_colon_here", 1.0)])
    with pytest.raises(ValueError, match="not both"):
        RewardScorer(function="user_rewards:contains_truth", functions=[("verify", 1.0)])
