"""Which directory each agent's learner and rollout engines load (design §12): a full model's
HF directory, or a LoRA agent's adapter directory on its base.

A LoRA agent on its configured base (`team.agents[i].lora`, or `trainer.lora`) starts from a
fresh adapter made once in the model cache (`satseq.models.adapters.initial_adapter`, seeded
per agent), so that its learner and its engines load the same one; an agent whose `path` is an
adapter directory starts from that adapter. Bad LoRA input fails here, before any actor starts,
naming the config key and its value.
"""

from __future__ import annotations

from pathlib import Path

from satseq.config import RunConfig
from satseq.model_trust import trust
from satseq.models import is_adapter_dir, load_tokenizer, resolve_model_path
from satseq.models.adapters import LoraSpec, adapter_base, initial_adapter
from satseq.seeds import agent_seed


def agent_model_dir(config: RunConfig, i: int, path: str | None = None) -> str:
    """The directory agent i loads for `path` (a swap's; None: `team.agents[i].path`)."""
    agent = config.team.agents[i]
    lora = config.agent_lora(i)
    if path is not None and path != agent.path:  # a swap's model
        return str(resolve_model_path(path))
    if lora is None or is_adapter_dir(agent.path):
        return str(resolve_model_path(agent.path, agent.revision))
    key = f"team.agents.{i}.lora" if agent.lora else "trainer.lora"
    targets = lora.target_modules
    spec = LoraSpec(
        lora.rank,
        lora.scale_alpha,
        lora.dropout,
        targets if isinstance(targets, str) else tuple(targets),
    )
    base = resolve_model_path(agent.path, agent.revision)
    try:
        return str(initial_adapter(base, spec, agent_seed(config.trainer.seed, i)))
    except ValueError as error:  # the one thing the config cannot check: the model's layers
        raise ValueError(f"{key}.target_modules: {targets!r}: {error}") from None


def agent_model_dirs(config: RunConfig) -> list[str]:
    """Every agent's directory, in team order, after checking that the LoRA agents' bases
    share a tokenizer (the team's adapters are one token space)."""
    dirs = [agent_model_dir(config, i) for i in range(len(config.team.agents))]
    lora = [i for i, directory in enumerate(dirs) if is_adapter_dir(directory)]
    if lora:
        first = lora[0]
        vocabulary = load_tokenizer(adapter_base(dirs[first])).get_vocab()
        for i in lora[1:]:
            if load_tokenizer(adapter_base(dirs[i])).get_vocab() != vocabulary:
                paths = config.team.agents
                raise ValueError(
                    f"team.agents.{i}.path: {paths[i].path!r} has another tokenizer than "
                    f"team.agents.{first}.path: {paths[first].path!r}: the LoRA agents of a "
                    "team must be on bases that share a tokenizer"
                )
    return dirs


def trust_team(config: RunConfig, run_dir: str | Path | None = None) -> None:
    """Trust the code of every agent with `trust_remote_code` (`satseq.model_trust`): its model
    and, in a run's output (`run_dir`), every stage saved as `agent_<name>/`. Called by a command
    before Ray starts, so that every worker reads the same list."""
    directories = []
    for agent in config.team.agents:
        if agent.trust_remote_code:
            directories.append(resolve_model_path(agent.path, agent.revision))
            if run_dir is not None:
                directories.append(Path(run_dir) / f"agent_{agent.name}")
    trust(directories)
