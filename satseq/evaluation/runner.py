"""`satseq eval`: start rollout actors on the team's checkpoints, evaluate, write the outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
import yaml

from satseq.actors.rollout import spread_requests
from satseq.config import QUICKSTART, RunConfig, dump_config, load_config
from satseq.evaluation.checkpoints import resolve_team
from satseq.evaluation.datasets import resolve_dataset
from satseq.evaluation.outputs import write_outputs
from satseq.evaluation.team import TeamEvaluation, evaluate_team
from satseq.launch import actors as launch_actors
from satseq.launch import builders
from satseq.launch.connection import connect
from satseq.models import load_tokenizer

TRAIN_CONFIG = "train_config.yaml"


def run_config_for(checkpoint_dir: str | Path, overrides: list[str]) -> RunConfig:
    """The config a team was trained with (`<dir>/train_config.yaml`), else the quickstart's,
    then `overrides`: so evaluation and serving prompt and score as training did."""
    trained = Path(checkpoint_dir) / TRAIN_CONFIG
    return load_config(trained if trained.is_file() else QUICKSTART, overrides)


def run_evaluation(
    config: RunConfig,
    dataset: str,
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    samples_per_agent: int | None = None,
    stage: int | None = None,
    address: str | None = None,
) -> tuple[TeamEvaluation, dict[str, Any]]:
    """Evaluate the team in `checkpoint_dir` on `dataset`; returns (evaluation, summary).

    Raises DataError (dataset) or CheckpointError (checkpoint dir) before starting anything.
    """
    team = resolve_team(checkpoint_dir, stage)
    problems = resolve_dataset(dataset, config)
    k = samples_per_agent or config.eval.samples_per_agent
    spec = builders.eval_sampling_spec(config)
    connect(address)
    options = launch_actors.rollout_actor_options(config)  # the cluster is asked once
    actors = launch_actors.start_rollout_actors(
        config,
        {name: str(path) for name, path in team.agent_paths.items()},
        config.eval.seed,
        lambda j: options | {"name": f"satseq-eval-rollout-{j}"},
    )
    try:
        evaluation = evaluate_team(
            problems,
            team.agent_names,
            spread_requests(actors),
            [load_tokenizer(path) for path in team.agent_paths.values()],
            builders.prompt_format(config),
            builders.reward_scorer(config),
            k,
            spec,
        )
    finally:
        for actor in actors:
            ray.kill(actor)
    inference_config = {
        "dataset": dataset,
        "checkpoint_dir": str(checkpoint_dir),
        "agents": {
            name: {"path": str(path), "stage": team.stages[name]}
            for name, path in team.agent_paths.items()
        },
        "samples_per_agent": k,
        "sampling": {
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k,
            "max_new_tokens": spec.max_new_tokens,
            "seed": spec.seed,
        },
        "engine": config.rollout.engine,
        "config": yaml_config(config),
    }
    return evaluation, write_outputs(output_dir, evaluation, inference_config)


def yaml_config(config: RunConfig) -> dict[str, Any]:
    return yaml.safe_load(dump_config(config))
