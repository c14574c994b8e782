"""Two evaluations' team votes paired by problem (`satseq eval --against`): counts by hand, the
files as `satseq eval` writes them, and every unreadable input named with its file and line."""

import json

import pytest

from satseq.algo.eval_metrics import paired_difference_interval, sign_test_p_value
from satseq.evaluation import CheckpointError, ProblemResult, TeamEvaluation, write_predictions
from satseq.evaluation.compare import PooledVotes, paired_votes, read_team_votes


def compare_votes(before_dir, after_dir):
    """The two output directories' votes, as `satseq eval --against before_dir` pairs them."""
    return paired_votes(
        read_team_votes(before_dir),
        read_team_votes(after_dir),
        str(before_dir),
    )


def eval_dir(root, name: str, correct: dict[str, bool]):
    """An eval output directory whose team vote is right on the problems marked True."""
    results = [
        ProblemResult(
            problem_id=problem_id,
            prompt=f"problem {problem_id}",
            ground_truth="1",
            predicted_answer="1" if right else "2",
            individual_answers={"a0": ["1" if right else "2"]},
            individual_correct={"a0": [right]},
            votes={"1" if right else "2": 1},
            agreement=1.0,
            correct=right,
            pass_at_k=float(right),
            avg_at_k=float(right),
            agent_correct={"a0": right},
        )
        for problem_id, right in correct.items()
    ]
    directory = root / name
    directory.mkdir()
    write_predictions(directory / "predictions.jsonl", TeamEvaluation(results, ["a0"], 1, 1.0))
    return directory


def test_gained_and_lost_are_the_problems_each_run_alone_got_right(tmp_path):
    before = {"p0": True, "p1": True, "p2": False, "p3": False, "p4": False}
    after = {"p0": True, "p1": False, "p2": True, "p3": True, "p4": False}
    paired = compare_votes(eval_dir(tmp_path, "before", before), eval_dir(tmp_path, "after", after))
    assert (paired.gained, paired.lost, paired.num_problems) == (2, 1, 5)  # p2, p3; p1
    assert (paired.accuracy_before, paired.accuracy_after) == (0.4, 0.6)
    assert paired.p_value == sign_test_p_value(2, 1) == 1.0
    assert paired.before == str(tmp_path / "before")
    assert "0.400 → 0.600 on 5 problems: 2 gained, 1 lost" in paired.describe()
    # the pairing is by problem id, not by line order
    assert paired_votes(before, dict(reversed(after.items())), "x") == paired_votes(
        before, after, "x"
    )


def test_evaluations_of_other_problems_are_refused_naming_both_sides():
    with pytest.raises(CheckpointError, match=r"earlier holds other problems.*1 only there.*'b'"):
        paired_votes({"a": True, "b": True}, {"a": True, "c": False}, "earlier")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "holds no predictions"),
        (['{"problem_id": "p0", "correct": true}', "not json"], r"predictions\.jsonl:2: not a"),
        (['{"problem_id": "p0"}'], r"predictions\.jsonl:1: not a prediction record"),
        (['["p0", true]'], r"predictions\.jsonl:1: not a prediction record"),
        (['{"problem_id": "p0", "correct": 1}'], r":1: 'correct' is 1, not a bool"),
        (
            ['{"problem_id": "p0", "correct": true}', '{"problem_id": "p0", "correct": false}'],
            r":2: problem 'p0' appears twice",
        ),
    ],
)
def test_an_unreadable_predictions_file_is_named_with_its_line(tmp_path, lines, message):
    good = eval_dir(tmp_path, "good", {"p0": True})
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "predictions.jsonl").write_text("".join(line + "\n" for line in lines))
    with pytest.raises(CheckpointError, match=message):
        compare_votes(bad, good)
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'empty'}.*does not exist"):
        compare_votes(good, tmp_path / "empty")


def test_a_file_that_is_not_text_is_named(tmp_path):
    (tmp_path / "predictions.jsonl").write_bytes(b'{"problem_id": "\xff"}')
    with pytest.raises(CheckpointError, match=r"predictions\.jsonl is not UTF-8 text"):
        read_team_votes(tmp_path)


def test_blank_lines_are_skipped(tmp_path):
    directory = tmp_path / "blank"
    directory.mkdir()
    record = json.dumps({"problem_id": "p0", "correct": True})
    (directory / "predictions.jsonl").write_text(f"\n{record}\n\n")
    assert compare_votes(directory, directory).num_problems == 1


def test_pooled_votes_sum_the_seeds_counts_by_hand():
    """Three seeds of 100 problems, (12, 5), (9, 6), (14, 4) gained/lost: 35 gained, 15 lost of
    300 pairs, Δ = 20/300; p is McNemar's on (35, 15); the interval is the paired Wald one."""
    runs = [
        paired_votes(
            {str(i): i < 10 or (10 <= i < 10 + lost) for i in range(100)},
            {str(i): i < 10 or (10 + lost <= i < 10 + lost + gained) for i in range(100)},
            f"seed {seed}",
        )
        for seed, (gained, lost) in enumerate([(12, 5), (9, 6), (14, 4)])
    ]
    assert [(r.gained, r.lost) for r in runs] == [(12, 5), (9, 6), (14, 4)]
    pooled = PooledVotes(runs)
    assert (pooled.gained, pooled.lost, pooled.num_problems) == (35, 15, 300)
    assert pooled.difference == pytest.approx(20 / 300)
    assert pooled.p_value == sign_test_p_value(35, 15)
    assert pooled.interval == paired_difference_interval(35, 15, 300)
    assert pooled.interval[0] > 0  # this much, pooled, excludes no change
    assert "35 gained, 15 lost" in pooled.describe()
