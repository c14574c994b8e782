"""The Coordinator actor: runs a team's stages one after another (DESIGN §3).

It starts the team (placement group, learners, rollout actors, sandbox pool) as a `TeamRuntime`
over Ray, builds the recipe `algorithm.name` selects on it, and around each of the recipe's
stages runs validation, writes the outputs and the resume checkpoint. What one stage does is the
recipe, read top to bottom in `satseq/cluster/recipes/<name>.py`: sat_seq, spo or grpo.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from satseq.cluster import builders
from satseq.cluster.checkpoint import load_latest_checkpoint, save_checkpoint
from satseq.cluster.metrics import StageLog
from satseq.cluster.recipes import RECIPES
from satseq.cluster.runtime import start_on_ray
from satseq.config import RunConfig
from satseq.evaluation.datasets import resolve_dataset
from satseq.evaluation.outputs import write_predictions
from satseq.evaluation.team import evaluate_team
from satseq.launch.builders import eval_sampling_spec


class Coordinator:
    """Owns the team's actors and runs stages. Plain class; `CoordinatorActor` is its actor."""

    def __init__(self, config: RunConfig, output_dir: str, resume: bool = False):
        self.config = config
        self.output_dir = Path(output_dir)
        recipe_class = RECIPES[config.algorithm.name]
        self.runtime = start_on_ray(config, recipe_class.learner_settings(config))
        self.val_problems = [
            problem
            for name in (config.data.val_files if config.trainer.val_every else [])
            for problem in resolve_dataset(name, config)
        ]
        self.stage = 0
        self.recipe = recipe_class(config, self.runtime, builders.training_problems(config))
        resumed_stage = self._restore() if resume else None
        self.log = StageLog(self.output_dir, config.output.tensorboard, resumed_stage)

    # --- one stage ----------------------------------------------------------------------------

    def run_stage(self) -> dict[str, Any]:
        """The recipe's stage `self.stage`, then its outputs and the resume checkpoint."""
        result = self.recipe.run_stage(self.stage)
        metrics = {"stage": self.stage, **result.metrics}
        if self._validation_due():
            self.runtime.set_progress("validation")
            metrics |= self.validate()
        self.stage += 1
        self._write_outputs(metrics, result.certificate)
        return metrics

    def _validation_due(self) -> bool:
        every, last = self.config.trainer.val_every, self.config.trainer.stages - 1
        return (
            bool(self.val_problems)
            and every > 0
            and ((self.stage + 1) % every == 0 or self.stage == last)
        )

    def validate(self) -> dict[str, float]:
        """The `satseq eval` routine on the validation set with the team's current weights;
        writes validation_data/<stage>.jsonl (the seeds' layout) and returns val/ metrics."""
        rt = self.runtime
        evaluation = evaluate_team(
            self.val_problems,
            rt.agents,
            rt.generate,
            rt.tokenizers,
            rt.prompt_format,
            rt.scorer,
            self.config.eval.samples_per_agent,
            eval_sampling_spec(self.config),
        )
        write_predictions(self.output_dir / "validation_data" / f"{self.stage}.jsonl", evaluation)
        return evaluation.metrics(prefix="val/")

    # --- outputs and resume ---------------------------------------------------------------------

    def _write_outputs(self, metrics: dict[str, Any], certificate: dict[str, Any]) -> None:
        stage = metrics["stage"]
        self.log.write(metrics, {"stage": stage, **certificate})
        last = stage + 1 == self.config.trainer.stages
        if (stage + 1) % self.config.trainer.save_every == 0 or last:
            ray.get(
                [
                    learner.save_pretrained.remote(
                        str(self.output_dir / f"agent_{name}" / f"stage_{stage}")
                    )
                    for learner, name in zip(
                        self.runtime.learners, self.runtime.agents, strict=True
                    )
                ]
            )
        self.checkpoint()

    def checkpoint(self) -> None:
        """The resume state after the last complete stage, written atomically."""
        if self.stage == 0:
            return
        state = {
            "stage": self.stage,
            "learners": ray.get([learner.state_dict.remote() for learner in self.runtime.learners]),
            "recipe": self.recipe.state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        }
        save_checkpoint(self.output_dir / "checkpoints", self.stage - 1, state)

    def _restore(self) -> int | None:
        """Load the newest checkpoint, push its weights to the engines; the stage it ended."""
        found = load_latest_checkpoint(self.output_dir / "checkpoints")
        if found is None:
            return None
        completed_stage, state = found
        ray.get(
            [
                learner.load_state_dict.remote(s)
                for learner, s in zip(self.runtime.learners, state["learners"], strict=True)
            ]
        )
        for i in range(len(self.runtime.agents)):
            self.runtime.push_weights(i)
        self.stage = state["stage"]
        self.recipe.load_state_dict(state["recipe"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        return completed_stage

    # --- progress (polled by the driver while a stage runs) -------------------------------------

    def get_progress(self) -> dict[str, Any]:
        return {"stage": self.stage, **self.runtime.progress}

    def next_stage(self) -> int:
        return self.stage

    def close(self) -> None:
        self.log.close()
        self.runtime.scorer.close()


CoordinatorActor = ray.remote(num_cpus=0, max_concurrency=2)(Coordinator)
