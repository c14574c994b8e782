"""The Coordinator actor: runs a team's stages one after another (design §3).

It starts the team (placement group, learners, rollout actors, sandbox pool) as a `TeamRuntime`
over Ray, builds the recipe `algorithm.name` selects on it, and around each of the recipe's
stages runs validation, writes the outputs and the resume checkpoint. What one stage does is the
recipe, read top to bottom in `satseq/cluster/recipes/<name>.py`: sat_seq, spo or grpo.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from satseq.actors.incarnation import actor_key, check_not_restarted, incarnations
from satseq.actors.learner import Learner
from satseq.actors.rollout import RolloutWorker
from satseq.cluster.checkpoint import (
    learner_state_path,
    load_latest_run_state,
    prune_saved_stages,
    run_storage,
    save_run_state,
)
from satseq.cluster.faults import (
    ACTOR_LOSS,
    FaultLog,
    actor_roles,
    fault_kind,
    wait_until_alive,
)
from satseq.cluster.metric_keys import RUN_TOKENS, stage_tokens
from satseq.cluster.metrics import StageLog
from satseq.cluster.recipes import RECIPES
from satseq.cluster.recipes.certificate import certification_warning
from satseq.cluster.runtime import TeamRuntime
from satseq.cluster.swap import apply_swaps
from satseq.cluster.team import start_on_ray
from satseq.cluster.training_data import training_problems
from satseq.config import RunConfig
from satseq.evaluation.datasets import resolve_dataset
from satseq.evaluation.outputs import write_predictions
from satseq.evaluation.team import evaluate_team
from satseq.launch.settings import eval_sampling_spec
from satseq.sandbox.pool import SandboxPool

StartTeam = Callable[[RunConfig, Any], TeamRuntime]
"""Starts a run's team: `start_on_ray`, or `team.start_in_process` (the whole stage loop, with
its outputs, checkpoints and resume, in one process: tests)."""


class Coordinator:
    """Owns the team's actors and runs stages. Plain class; `coordinator_actor.CoordinatorActor`
    runs it in its own process. It reaches the actors only through the runtime's calls
    (`satseq.actors.calls`), so it runs over Ray or in process alike."""

    def __init__(
        self,
        config: RunConfig,
        output_dir: str,
        resume: bool = False,
        start_team: StartTeam = start_on_ray,
    ):
        self.config = config
        self.output_dir = Path(output_dir)
        self.storage = run_storage(self.output_dir, config.output.storage)
        """Where checkpoints and saved stages are also written (`output.storage`), or None."""
        self.recipe_class = RECIPES[config.algorithm.name]
        self.runtime = start_team(config, self.recipe_class.learner_settings(config))
        self.calls = self.runtime.calls
        self.val_problems = [
            problem
            for name in (config.data.val_files if config.trainer.val_every else [])
            for problem in resolve_dataset(name, config)
        ]
        self.problems = training_problems(config)
        self.stage = 0
        self.tokens_generated = 0
        """Generated for training by the stages done (`trainer.max_generated_tokens`)."""
        self.recipe = self.recipe_class(config, self.runtime, self.problems)
        self.first_rng = _rng_state()  # stage 0's, for a retry of stage 0
        self.faults = FaultLog(config.trainer.max_stage_retries)
        self.incarnations = incarnations(self._team_actors(), self.calls)
        """Every learner's and rollout actor's process when the stage began (`faults`)."""
        resumed_stage = self._restore() if resume else None
        self.log = StageLog(self.output_dir, config, resumed_stage, self.storage)
        self.start_warnings = [w for w in [certification_warning(config)] if w]
        """What the driver warns of before the first stage (this actor's log does not reach
        the console)."""

    # --- one stage ----------------------------------------------------------------------------

    def run_stage(self) -> dict[str, Any]:
        """The recipe's stage `self.stage`, its outputs and the resume checkpoint; all of it
        again from the stage's start whenever an actor or a node died on the way."""
        lost: BaseException | None = None
        while True:
            try:
                if lost is not None:  # inside the try: a loss during recovery is retried too
                    self._recover(lost)
                # a swap due now happens inside the retry: a retry restores the team before it
                swap_dir = self.output_dir / "checkpoints" / "swaps"
                swaps = apply_swaps(self.runtime, self.config, self.recipe, self.stage, swap_dir)
                result = self.recipe.run_stage(self.stage)
                metrics = {"stage": self.stage, **swaps, **result.metrics}
                metrics["time/weight_sync"] = self.runtime.weight_sync.take_seconds()
                metrics[RUN_TOKENS] = self.tokens_generated + stage_tokens(metrics)
                last = self.config.trainer.run_ends(self.stage + 1, metrics[RUN_TOKENS])
                if self._validation_due(last):
                    self.runtime.set_progress("validation")
                    metrics |= self.validate()
                metrics |= self.faults.stage_metrics()
                self._write_outputs(metrics, result.certificate, last)
                break
            except ACTOR_LOSS as error:
                lost = error
        self.faults.next_stage()
        self.stage += 1
        self.tokens_generated = metrics[RUN_TOKENS]
        return metrics

    def _recover(self, error: BaseException) -> None:
        """After an actor or node loss: count it (StageFailed past the retry bound), wait for Ray
        to restart what died, and put the team back to the start of the stage. A loss on the way
        (an actor restarted once more) comes back here through `run_stage`, counted again."""
        rt = self.runtime
        roles = actor_roles(
            learner=self._learner_actors(),
            rollout=rt.team.rollouts,
            sandbox=[rt.team.sandbox] if rt.team.sandbox else [],
        )
        kind = fault_kind(error, roles)
        self.faults.record(kind, self.stage, error)
        started = time.perf_counter()
        rt.set_progress(f"recovering ({kind} died)")
        wait_until_alive(self._pings())
        # before the reset: an actor restarted during it is caught at the stage's end
        self.incarnations = incarnations(self._team_actors(), self.calls)
        rt.weight_sync.forget()  # a restarted actor is in no group
        self._reset_to_stage_start()
        self.faults.recovery_seconds += time.perf_counter() - started

    def _learner_actors(self) -> list[Any]:
        """Every learner's actors, each once (the LoRA agents of one base share one)."""
        learners = self.runtime.team.learners
        actors = [actor for learner in learners for actor in learner.actors]
        return list({actor_key(actor): actor for actor in actors}.values())

    def _team_actors(self) -> list[tuple[Any, Callable]]:
        """Each learner and rollout actor with its `incarnation` method."""
        team = [(actor, Learner.incarnation) for actor in self._learner_actors()]
        return team + [(worker, RolloutWorker.incarnation) for worker in self.runtime.team.rollouts]

    def _pings(self) -> list[tuple[Any, Callable]]:
        rt = self.runtime
        pings = [(learner, Learner.ready) for learner in rt.team.learners]
        pings += [(worker, RolloutWorker.ready) for worker in rt.team.rollouts]
        return pings + ([(rt.team.sandbox, SandboxPool.start)] if rt.team.sandbox else [])

    def _reset_to_stage_start(self) -> None:
        """Learners, engines, recipe and RNG as they were when the stage began: from the last
        checkpoint, or for stage 0 from the start (learners reset to their initial state). The
        rollouts generated ahead are dropped first (the checkpoint holds the queue)."""
        self.recipe.close()
        if self.stage > 0:
            self._restore()
            return
        self._rebuild_swapped_agents(self._configured_paths())
        self.runtime.reset_learners()
        self.runtime.weight_sync.push_all()
        self.recipe = self.recipe_class(self.config, self.runtime, self.problems)
        _set_rng_state(self.first_rng)

    def finished(self) -> bool:
        """No stage is left to run (the driver's loop ends)."""
        return self.config.trainer.run_ends(self.stage, self.tokens_generated)

    def _validation_due(self, last: bool) -> bool:
        every = self.config.trainer.val_every
        return bool(self.val_problems) and every > 0 and ((self.stage + 1) % every == 0 or last)

    def validate(self) -> dict[str, float]:
        """The `satseq eval` routine on the validation set with the team's current weights;
        writes validation_data/<stage>.jsonl (the seeds' layout) and returns val/ metrics."""
        rt = self.runtime
        evaluation = evaluate_team(
            self.val_problems,
            rt.team.agents,
            rt.generate,
            rt.team.tokenizers,
            rt.prompt_format,
            rt.scorer,
            self.config.eval.samples_per_agent,
            eval_sampling_spec(self.config),
        )
        predictions = self.output_dir / "validation_data" / f"{self.stage}.jsonl"
        write_predictions(predictions, evaluation)
        if self.storage is not None:
            self.storage.upload(predictions)
        return evaluation.metrics(prefix="val/")

    # --- outputs and resume ---------------------------------------------------------------------

    def _write_outputs(
        self, metrics: dict[str, Any], certificate: dict[str, Any], last: bool
    ) -> None:
        """The stage's HF directories (every `save_every` stages and the last), then its line of
        metrics.jsonl and the resume checkpoint. Everything that asks the actors comes first, so
        an actor lost here, or restarted by Ray at any time since the stage began (its calls
        then ran on its constructor's state), leaves no line behind and the stage is retried
        whole."""
        stage = metrics["stage"]
        checkpoints = self.output_dir / "checkpoints"
        start, learners = self.calls.start, self.runtime.team.learners
        writes = [  # each learner writes its resume file and, when due, its HF dir: one round
            start(
                learner,
                Learner.save_state,
                str(learner_state_path(checkpoints, stage, i)),
                self.storage,
            )
            for i, learner in enumerate(learners)
        ]
        if (stage + 1) % self.config.trainer.save_every == 0 or last:
            writes += [
                start(
                    learner,
                    Learner.save_pretrained,
                    str(self.output_dir / f"agent_{name}" / f"stage_{stage}"),
                    self.storage,
                )
                for learner, name in zip(learners, self.runtime.team.agents, strict=True)
            ]
        team = self._team_actors()
        asked = [start(actor, method) for actor, method in team]  # each after its actor's writes
        self.calls.wait(writes)
        now = incarnations(team, self.calls, asked)
        check_not_restarted(self.incarnations, now)
        self.incarnations = now  # a swap's new learner from here on
        state = {
            "stage": stage + 1,  # where a resumed run starts
            "tokens_generated": metrics[RUN_TOKENS],
            "recipe": self.recipe.state_dict(),
            "rng": _rng_state(),
            "agent_paths": list(self.runtime.team.agent_paths),  # swaps change them
        }
        self.log.write(metrics, {"stage": stage, **certificate})
        save_run_state(checkpoints, stage, state, storage=self.storage)
        if self.config.output.keep_last is not None:
            in_use = self.runtime.team.agent_paths + [swap.path for swap in self.config.team.swaps]
            prune_saved_stages(
                self.output_dir,
                self.runtime.team.agents,
                self.config.output.keep_last,
                {Path(path) for path in in_use},
                self.storage,
            )

    def _restore(self) -> int | None:
        """Load the newest checkpoint, push its weights to the engines; the stage it ended."""
        checkpoints = self.output_dir / "checkpoints"
        found = load_latest_run_state(checkpoints, self.storage)
        if found is None:
            return None
        completed_stage, state = found
        self._rebuild_swapped_agents(state["agent_paths"])
        self.calls.wait(
            [
                self.calls.start(
                    learner,
                    Learner.load_state,
                    str(learner_state_path(checkpoints, completed_stage, i)),
                    self.storage,
                )
                for i, learner in enumerate(self.runtime.team.learners)
            ]
        )
        self.runtime.weight_sync.push_all()
        self.stage = state["stage"]
        self.tokens_generated = state.get("tokens_generated", 0)  # 0: saved before the budget
        self.recipe.load_state_dict(state["recipe"])
        _set_rng_state(state["rng"])
        return completed_stage

    def _configured_paths(self) -> list[str]:
        return [agent.path for agent in self.config.team.agents]

    def _rebuild_swapped_agents(self, paths: list[str]) -> None:
        """Each agent's learner and engines on `paths[i]` (the checkpoint's), where the running
        one differs or was swapped (a restarted rollout actor comes back on the configured
        model); their state is loaded next."""
        rt = self.runtime
        configured = self._configured_paths()
        for i, path in enumerate(paths):
            if path != rt.team.agent_paths[i] or path != configured[i]:
                if self.storage is not None:  # a stage this run saved, maybe on a lost node
                    self.storage.fetch(path)
                rt.replace_agent(i, path)

    # --- progress (polled by the driver while a stage runs) -------------------------------------

    def get_progress(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            **self.runtime.progress,
            "faults": self.faults.total,
            "trackers_failed": sorted(self.log.trackers.failed),  # dropped with a warning
        }

    def next_stage(self) -> int:
        return self.stage

    def close(self) -> list[str]:
        """Closes the outputs, the recipe and the scorer; returns the trackers' warnings, for
        the driver (this actor's log does not reach the console)."""
        self.recipe.close()
        self.log.close()
        self.runtime.scorer.close()
        return list(self.log.trackers.failed.values())


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
