"""RewardScorer end to end: batches and their counts, pickling, threads, configuration errors."""

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from satseq.rewards import HelperStartError, RewardScorer


def test_score_batch_returns_scores_and_what_happened(scorer):
    batch = scorer.score_batch(
        prompts=["p1", "p2", "p3", "p4"],
        responses=["\\boxed{\\frac{1}{2}}", "\\boxed{3}", "I give up.", "the answer is 0.5"],
        ground_truths=["0.5", "4", "1", "1/2"],
    )
    assert batch.scores == [1.0, 0.0, 0.0, 1.0]
    assert batch.statuses == ["scored", "scored", "no_answer", "scored"]
    assert (batch.n_no_answer, batch.n_timeout, batch.n_failed) == (1, 0, 0)
    assert batch.first_error is None


def test_boxed_only_scorer_ignores_unboxed_answers(scorer):
    assert scorer.score("", "Answer: 7", "7") == 1.0
    with RewardScorer(fallbacks=(), timeout_s=10.0) as boxed_only:
        batch = boxed_only.score_batch([""], ["Answer: 7"], ["7"])
    assert batch.scores == [0.0]
    assert batch.statuses == ["no_answer"]


def test_score_batch_rejects_sequences_of_different_lengths(scorer):
    with pytest.raises(ValueError, match="2 prompts, 1 responses"):
        scorer.score_batch(["a", "b"], ["\\boxed{1}"], ["1", "1"])


def test_pickled_scorer_scores_in_another_thread(scorer):
    """What Ray does to a scorer: pickle it, and call it from an actor's worker thread."""
    shipped = pickle.loads(pickle.dumps(scorer))
    results = []
    thread = threading.Thread(
        target=lambda: results.append(shipped.score("", "\\boxed{2^{10}}", "1024"))
    )
    thread.start()
    thread.join()
    shipped.close()
    assert results == [1.0]
    assert shipped.timeout_s == scorer.timeout_s


def test_concurrent_threads_get_right_answers(scorer):
    truths = [str(n) for n in range(24)]
    responses = [f"\\boxed{{{n if n % 3 else n + 1}}}" for n in range(24)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        scores = list(
            pool.map(lambda pair: scorer.score("", *pair), zip(responses, truths, strict=True))
        )
    assert scores == [0.0 if n % 3 == 0 else 1.0 for n in range(24)]


def test_extract_answer_uses_the_configured_fallbacks(scorer):
    assert scorer.extract_answer("so the answer is $-3$.") == "-3"
    assert RewardScorer(fallbacks=()).extract_answer("so the answer is $-3$.") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fallbacks": ("answer_colon", "guess")}, "unknown fallback"),
        ({"timeout_s": 0}, "timeout_s must be positive"),
    ],
)
def test_bad_configuration_is_rejected_with_the_config_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardScorer(**kwargs)


def test_a_helper_that_cannot_start_stops_the_batch_instead_of_scoring_every_sample_0(
    tmp_path, monkeypatch
):
    """A `numbers.py` in the working directory shadows the standard library's in the helper
    (`python -c` puts the directory first on its path), so sympy's import dies before the
    helper answers: every sample would fail, and the batch raises saying so (it used to score
    each sample 0, starting and losing a helper per sample)."""
    (tmp_path / "numbers.py").write_text("raise ImportError('shadows the stdlib')")
    monkeypatch.chdir(tmp_path)
    with (
        RewardScorer(timeout_s=10.0) as scorer,
        pytest.raises(HelperStartError, match="exited with code 1 while starting up"),
    ):
        scorer.score_batch(["p1", "p2"], ["\\boxed{1}", "\\boxed{2}"], ["1", "2"])
