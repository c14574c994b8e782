"""One agent's learner (design §3 step 6, §11). Its files say what a learner holds and does:

- `specs.py`: what it is built from (loss, trust region, optimiser, the rest of its settings);
- `results.py`: what its calls return (plain data, importable without Ray);
- `policy.py`: the model and optimiser on the device, and the forward passes over a batch;
- `update.py`: the trust-region update, step by step and attempt by attempt;
- `distill.py`: the Stage-0 projection of a swapped-in agent;
- `weights_out.py`: weights to the rollout engines and to HF directories;
- `state.py`: the resume state, in and out; `snapshot.py`: the backtracking snapshot;
- `learner.py`: `Learner`, the calls an actor answers; `rank.py`: a sharded agent's rank;
- `actor.py`: both as Ray actors (the one module that imports Ray); `group.py`: a sharded
  agent's ranks behind one handle.
"""

from satseq.actors.learner.learner import Learner
from satseq.actors.learner.results import DistillResult, PolicyStates, UpdateResult
from satseq.actors.learner.specs import LearnerSpec, LossSpec, OptimizerSpec, TrustRegionSpec

__all__ = [
    "DistillResult",
    "Learner",
    "LearnerSpec",
    "LossSpec",
    "OptimizerSpec",
    "PolicyStates",
    "TrustRegionSpec",
    "UpdateResult",
]
