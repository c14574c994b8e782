"""The vote and metric assembly of `evaluate_team`, on a hand-computed two-problem case.

A scripted `generate` returns fixed texts, so every number below can be worked out by hand;
tokenizer, scorer (math-verify) and the vote are the real ones.
"""

import pytest
from transformers import AutoTokenizer

from satseq.actors.trajectory import Generation, SamplingSpec
from satseq.algo.eval_metrics import majority_vote
from satseq.data import DEFAULT_PROMPT_FORMAT, MathProblem
from satseq.evaluation import evaluate_team, team_vote
from satseq.models import resolve_model_path
from satseq.rewards import RewardScorer

# problem id → agent → its k = 2 samples as (text, log-probability)
SAMPLES = {
    "p1": {
        "a": [("so \\boxed{7}", -1.0), ("\\boxed{7.0}", -2.0)],
        "b": [("\\boxed{8}", -0.5), ("no idea", -0.1)],
    },
    # 2 votes each for 4 and 5: the tie goes to 5, whose samples have the higher total
    # log-probability (-1 - 0.5 > -3 - 2), although 4 reached two votes first.
    "p2": {
        "a": [("\\boxed{4}", -3.0), ("\\boxed{5}", -1.0)],
        "b": [("\\boxed{4}", -2.0), ("\\boxed{5}", -0.5)],
    },
}
PROBLEMS = [MathProblem("p1", "Compute 3 + 4.", "7"), MathProblem("p2", "Compute 2 + 3.", "5")]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny"))


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(timeout_s=10.0) as scorer:
        yield scorer


def scripted_generate(tokenizer):
    """A `generate` that answers each (agent, prompt) request with SAMPLES, in order."""
    calls = []

    def generate(requests, spec):
        calls.append((requests, spec))
        problem_order = [p.problem_id for p in PROBLEMS for _ in range(2)]
        return [
            [
                Generation(tokenizer.encode(text, add_special_tokens=False), "stop", logprob=lp)
                for text, lp in SAMPLES[problem_id][agent][:n]
            ]
            for problem_id, (agent, _, n) in zip(problem_order, requests, strict=True)
        ]

    return generate, calls


def test_majority_vote_ties_go_to_the_highest_total_score():
    same = str.__eq__
    answers = ["4", "5", "4", "5"]
    assert majority_vote(answers, same) == ("4", {"4": 2, "5": 2})  # first to reach 2
    assert majority_vote(answers, same, [-3.0, -1.0, -2.0, -0.5])[0] == "5"
    assert majority_vote(answers, same, [-1.0, -1.0, -1.0, -1.0])[0] == "4"  # equal: first
    assert majority_vote(["4", "4", "5"], same, [-9.0, -9.0, 0.0])[0] == "4"  # count first
    with pytest.raises(ValueError):
        majority_vote(answers, same, [0.0])


def test_team_vote_agreement_and_missing_logprobs():
    vote = team_vote(["7", "7", "8", None], [-1.0, -2.0, -0.5, -0.1], str.__eq__)
    assert (vote.answer, vote.votes, vote.agreement) == ("7", {"7": 2, "8": 1}, 2 / 3)
    # an engine without log-probs: ties fall back to the first cluster to reach the count
    assert team_vote(["4", "5", "4", "5"], [None] * 4, str.__eq__).answer == "4"
    assert team_vote([None, ""], [0.0, 0.0], str.__eq__).agreement == 0.0


def test_evaluate_team_by_hand(tokenizer, scorer):
    generate, calls = scripted_generate(tokenizer)
    spec = SamplingSpec(temperature=0.6, top_p=0.95)
    evaluation = evaluate_team(
        PROBLEMS,
        ["a", "b"],
        generate,
        [tokenizer, tokenizer],
        DEFAULT_PROMPT_FORMAT,
        scorer,
        2,
        spec,
    )

    requests, used_spec = calls[0]
    assert len(calls) == 1 and used_spec == spec
    assert [(agent, n) for agent, _, n in requests] == [("a", 2), ("b", 2)] * 2
    assert "Compute 3 + 4." in tokenizer.decode(requests[0][1])

    p1, p2 = evaluation.results
    assert p1.individual_answers == {"a": ["7", "7.0"], "b": ["8", None]}
    assert p1.individual_correct == {"a": [True, True], "b": [False, False]}
    assert (p1.predicted_answer, p1.votes, p1.correct) == ("7", {"7": 2, "8": 1}, True)
    assert p1.agreement == pytest.approx(2 / 3)
    # n = 4 team samples, c = 2 correct, k = 2: 1 - C(2,2)/C(4,2) = 5/6
    assert p1.pass_at_k == pytest.approx(5 / 6) and p1.avg_at_k == 0.5
    assert (p2.predicted_answer, p2.correct) == ("5", True)
    assert p2.pass_at_k == pytest.approx(5 / 6) and p2.avg_at_k == 0.5
    assert p1.agent_correct == {"a": True, "b": False}
    assert p2.agent_correct == {"a": True, "b": True}  # each agent's own tie goes to 5

    summary = evaluation.summary()
    assert summary["num_problems"] == 2 and summary["samples_per_agent"] == 2
    assert summary["maj@k"] == summary["team_vote_accuracy"] == 1.0
    assert summary["pass@k"] == pytest.approx(5 / 6) and summary["avg@k"] == 0.5
    assert summary["per_agent"]["a"] == {"accuracy": 1.0, "avg@k": 0.75, "pass@k": 1.0}
    assert summary["per_agent"]["b"] == {"accuracy": 0.5, "avg@k": 0.25, "pass@k": 0.5}
    assert summary["best_agent"] == {"name": "a", "accuracy": 1.0}
    assert "tools" not in summary and evaluation.tool_calls() == [0] * 8  # no tool loop
    assert evaluation.metrics("val/") == {
        "val/accuracy/team": 1.0,
        "val/accuracy/a": 1.0,
        "val/accuracy/b": 0.5,
        "val/pass@k": pytest.approx(5 / 6),
        "val/avg@k": 0.5,
        "val/maj@k": 1.0,
    }
    record = p1.as_record()
    for field in (
        "problem_id",
        "prompt",
        "predicted_answer",
        "individual_answers",
        "correct",
        "pass_at_k",
        "avg_at_k",
    ):
        assert field in record


def test_evaluate_team_rejects_mismatched_arguments(tokenizer, scorer):
    generate, _ = scripted_generate(tokenizer)
    args = (DEFAULT_PROMPT_FORMAT, scorer)
    with pytest.raises(ValueError, match="tokenizers"):
        evaluate_team(PROBLEMS, ["a", "b"], generate, [tokenizer], *args, 2, SamplingSpec())
    with pytest.raises(ValueError, match="k"):
        evaluate_team(PROBLEMS, ["a", "b"], generate, [tokenizer] * 2, *args, 0, SamplingSpec())
