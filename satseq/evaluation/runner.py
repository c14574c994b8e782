"""`satseq eval`: start rollout actors on the team's checkpoints, evaluate, write the outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray
import yaml

from satseq.actors.rollout import spread_requests
from satseq.actors.tool_loop import tool_usage
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
# `--tools`: the DESIGN §5 tool loop, and the prompt that tells the model it may write code
TOOL_OVERRIDES = ("rollout.tools.enabled=true", "data.prompt.tool_prompt=true")


def run_config_for(
    checkpoint_dir: str | Path, overrides: list[str], tools: bool = False
) -> RunConfig:
    """The config a team was trained with (`<dir>/train_config.yaml`), else the quickstart's,
    then `overrides`: so evaluation and serving prompt, score and run tools as training did.
    `tools` turns the tool loop on whatever the config says (`TOOL_OVERRIDES`, before
    `overrides`)."""
    trained = Path(checkpoint_dir) / TRAIN_CONFIG
    extra = list(TOOL_OVERRIDES) if tools else []
    return load_config(trained if trained.is_file() else QUICKSTART, [*extra, *overrides])


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

    With `rollout.tools.enabled`, every sample runs the tool loop on a sandbox pool started for
    this evaluation (limits: `rollout.tools`, `sandbox`), and the summary's "tools" says how
    much it was used (`tool_usage`); without, the summary has no "tools".

    Raises DataError (dataset) or CheckpointError (checkpoint dir) before starting anything.
    """
    team = resolve_team(checkpoint_dir, stage)
    problems = resolve_dataset(dataset, config)
    k = samples_per_agent or config.eval.samples_per_agent
    spec = builders.eval_sampling_spec(config)
    connect(address)
    options = launch_actors.rollout_actor_options(config)  # the cluster is asked once
    sandbox = None
    actors: list = []
    tools = None
    try:
        if config.rollout.tools.enabled:
            sandbox = launch_actors.start_sandbox_pool(config.sandbox, "satseq-eval-sandbox-pool")
        actors = launch_actors.start_rollout_actors(
            config,
            {name: str(path) for name, path in team.agent_paths.items()},
            config.eval.seed,
            lambda j: options | {"name": f"satseq-eval-rollout-{j}"},
            sandbox=sandbox,
        )
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
        if sandbox is not None:  # a pool of its own: its counts are this evaluation's runs
            statuses = ray.get(sandbox.metrics.remote())["statuses"]
            tools = tool_usage(evaluation.tool_calls(), statuses)
    finally:
        for actor in [*actors, sandbox] if sandbox is not None else actors:
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
    return evaluation, write_outputs(output_dir, evaluation, inference_config, tools)


def yaml_config(config: RunConfig) -> dict[str, Any]:
    return yaml.safe_load(dump_config(config))
