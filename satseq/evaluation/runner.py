"""`satseq eval`: start rollout actors on the team's checkpoints, evaluate, write the outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from satseq.actors.tool_usage import tool_usage
from satseq.config import RunConfig, dump_config
from satseq.evaluation.checkpoints import resolve_team
from satseq.evaluation.compare import paired_votes, read_team_votes, require_same_problems
from satseq.evaluation.datasets import resolve_dataset
from satseq.evaluation.outputs import write_outputs
from satseq.evaluation.team import TeamEvaluation, evaluate_team
from satseq.launch.actors import rollout_fleet
from satseq.launch.agent_models import trust_team
from satseq.launch.connection import connect
from satseq.launch.settings import eval_sampling_spec, prompt_format, reward_scorer
from satseq.models import is_adapter_dir, load_tokenizer
from satseq.models.adapters import merged_adapter


def run_evaluation(
    config: RunConfig,
    dataset: str,
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    samples_per_agent: int | None = None,
    stage: int | None = None,
    address: str | None = None,
    against: str | Path | None = None,
) -> tuple[TeamEvaluation, dict[str, Any]]:
    """Evaluate the team in `checkpoint_dir` on `dataset`; returns (evaluation, summary).

    With `rollout.tools.enabled`, every sample runs the tool loop on a sandbox pool started for
    this evaluation (limits: `rollout.tools`, `sandbox`), and the summary's "tools" says how
    much it was used (`tool_usage`); without, the summary has no "tools". With `against` (an
    earlier eval's output directory, on the same dataset), the summary's "against" pairs the
    two team votes problem by problem (`compare.PairedVotes`).

    Raises DataError (dataset) or CheckpointError (checkpoint dir; `against` unreadable or on
    other problems) before starting anything.
    """
    config = evaluation_config(config)
    team = resolve_team(checkpoint_dir, stage)
    problems = resolve_dataset(dataset, config)
    before = None
    if against is not None:
        before = read_team_votes(against)
        require_same_problems(before, [problem.problem_id for problem in problems], str(against))
    k = samples_per_agent or config.eval.samples_per_agent
    spec = eval_sampling_spec(config)
    trust_team(config, checkpoint_dir)  # before Ray: its workers read the list
    connect(address)
    agent_paths = scored_model_dirs(team.agent_paths, config.eval.merge_lora)
    with rollout_fleet(config, agent_paths, config.eval.seed, "satseq-eval") as fleet:
        evaluation = evaluate_team(
            problems,
            team.agent_names,
            fleet.generate,
            [load_tokenizer(path) for path in agent_paths.values()],
            prompt_format(config),
            reward_scorer(config),
            k,
            spec,
        )
        statuses = fleet.sandbox_statuses()  # a pool of its own: this evaluation's runs
    extras = {} if statuses is None else {"tools": tool_usage(evaluation.tool_calls(), statuses)}
    if before is not None:
        after = {result.problem_id: result.correct for result in evaluation.results}
        extras["against"] = paired_votes(before, after, str(against)).as_record()
    inference_config = {
        "dataset": dataset,
        "checkpoint_dir": str(checkpoint_dir),
        "agents": {
            name: {"path": str(path), "stage": team.stages[name]}
            | ({"merged": agent_paths[name]} if agent_paths[name] != str(path) else {})
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
    return evaluation, write_outputs(output_dir, evaluation, inference_config, extras)


def evaluation_config(config: RunConfig) -> RunConfig:
    """`config` as an evaluation runs it: with `eval.rollout_cpus`, each rollout actor's CPUs
    (and its CPU engines' threads) are those."""
    cpus = config.eval.rollout_cpus
    if cpus is None:
        return config
    resources = config.rollout.resources.model_copy(update={"num_cpus": cpus})
    rollout = config.rollout.model_copy(update={"resources": resources})
    return config.model_copy(update={"rollout": rollout})


def scored_model_dirs(agent_paths: dict[str, Path], merge_lora: bool) -> dict[str, str]:
    """The directory each agent is scored from: its own, or with `merge_lora` a LoRA agent's
    adapter merged into its base (`eval.merge_lora`, cached)."""
    return {
        name: str(merged_adapter(path) if merge_lora and is_adapter_dir(path) else path)
        for name, path in agent_paths.items()
    }


def yaml_config(config: RunConfig) -> dict[str, Any]:
    return yaml.safe_load(dump_config(config))
