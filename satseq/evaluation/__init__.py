"""Evaluation: score a team's vote and each agent on a dataset (design §7, §8).

from satseq.evaluation import evaluate_team
evaluation = evaluate_team(problems, agent_names, generate, tokenizers, prompt_format,
                           scorer, k=4, spec=SamplingSpec(temperature=0.6, top_p=0.95))
evaluation.summary()["team_vote_accuracy"], evaluation.metrics(prefix="val/")
"""

from satseq.evaluation.checkpoints import CheckpointError, TeamCheckpoint, resolve_team
from satseq.evaluation.datasets import HUB_DATASETS, SYNTHETIC_PREFIX, resolve_dataset
from satseq.evaluation.outputs import summary_table, write_outputs, write_predictions
from satseq.evaluation.team import ProblemResult, TeamEvaluation, evaluate_team
from satseq.evaluation.vote import TeamVote, team_vote

__all__ = [
    "HUB_DATASETS",
    "SYNTHETIC_PREFIX",
    "CheckpointError",
    "ProblemResult",
    "TeamCheckpoint",
    "TeamEvaluation",
    "TeamVote",
    "evaluate_team",
    "resolve_dataset",
    "resolve_team",
    "summary_table",
    "team_vote",
    "write_outputs",
    "write_predictions",
]
