"""`Learner`: one agent's learner, what its actor answers. It holds the agent's policy (model,
AdamW, residency: `policy.py`), its trust region and β_i, and in `gae` mode its value head, and
delegates each call to the module that does it: the update (`update.py`), the Stage-0
projection (`distill.py`), weights out (`weights_out.py`), resume state (`state.py`). All math
comes from `satseq.algo`. Sharded (`workers` W > 1), it is one of W ranks (`rank.py`); every
method gives the same result on every rank, and the same as one unsharded learner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from satseq.actors.forward import response_hidden_states, response_logprobs
from satseq.actors.incarnation import PROCESS_ID
from satseq.actors.learner import distill, weights_out
from satseq.actors.learner.policy import AgentPolicy
from satseq.actors.learner.results import DistillResult, PolicyStates, UpdateResult
from satseq.actors.learner.specs import LearnerSpec
from satseq.actors.learner.state import LearnerState
from satseq.actors.learner.update import run_update
from satseq.actors.residency import return_free_host_memory
from satseq.actors.sharding import free_address
from satseq.actors.tensor_bucket import TensorBucket
from satseq.actors.trajectory import Trajectory
from satseq.actors.value_head import ValueHead
from satseq.actors.weight_transfer import TensorSpec, TransferEndpoint, WeightSender
from satseq.algo.masks import owner_mask
from satseq.algo.trust_region import TrustRegion

if TYPE_CHECKING:
    from satseq.storage import StorageMirror


def while_resident(method: Callable) -> Callable:
    """A `Learner` method that steps or loads: it runs with the master weights and AdamW state
    on the device, which go back to host memory after it when the learner offloads; the host
    memory its transient tensors took goes back to the system (`return_free_host_memory`)."""

    @functools.wraps(method)
    def run(self: Learner, *args: Any, **kwargs: Any) -> Any:
        self.policy.residency.ensure_resident()
        result = method(self, *args, **kwargs)
        self.policy.residency.offload()
        return_free_host_memory()
        return result

    return run


def forward_pass(method: Callable) -> Callable:
    """A `Learner` method that only runs the model forward: an offloaded learner's weights are
    on the device for its span only (`Residency.forward_weights`)."""

    @functools.wraps(method)
    def run(self: Learner, *args: Any, **kwargs: Any) -> Any:
        with self.policy.residency.forward_weights():
            result = method(self, *args, **kwargs)
        self.policy.reshard()
        return result

    return run


class Learner:
    """One agent's model and optimiser. Plain class; `satseq.actors.learner.actor.LearnerActor`
    is its Ray actor."""

    def __init__(self, spec: LearnerSpec):
        self.spec = spec
        self.policy = AgentPolicy(spec)
        tr = spec.trust_region
        self.region = TrustRegion(
            target_kl=tr.target_kl,
            alpha=tr.alpha,
            max_backtracks=tr.max_backtracks,
            beta=tr.kl_coef,
            beta_growth=tr.beta_growth,
            step_shrink=tr.step_shrink,
            on_exhausted=tr.on_exhausted,
        )
        self.value_head = (
            ValueHead(self.policy.model.config.hidden_size, spec.value_lr, self.policy.device)
            if spec.value_lr is not None
            else None
        )
        self.state = LearnerState(self.policy, self.region, self.value_head)
        self.policy.residency.offload()
        self.sender: WeightSender | None = None  # `open_weight_transfer`'s

    # --- forward passes ------------------------------------------------------------------------

    @forward_pass
    def logprobs(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Teacher-forced log-probs at the sampling temperature, [N, T]."""
        policy, spec = self.policy, self.spec
        return policy.per_token(
            trajectories,
            lambda batch: response_logprobs(
                policy.trunk, batch, spec.temperature, spec.logit_chunk_tokens
            ),
        )

    @forward_pass
    def values(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """`gae` mode: V(s_t) before every response token, [N, T]."""
        return self.policy.per_token(
            trajectories,
            lambda batch: self.value_head(response_hidden_states(self.policy.trunk, batch)[0]),
        )

    @forward_pass
    def fit_values(self, trajectories: list[Trajectory], returns: torch.Tensor) -> float:
        """`gae` mode: `value_steps` steps of the value head towards the GAE returns [N, T] on
        the agent's tokens, with the current (updated) weights' hidden states. Returns the
        loss before the last step. Only the value head trains: an offloaded learner stays so.
        Sharded, every rank fits its own copy of the head on the whole batch."""
        policy = self.policy
        hidden, targets, masks = [], [], []
        with torch.no_grad(), policy.autocast():
            for rows, batch in policy.micro_batches(trajectories):
                batch = batch.to(policy.device)
                hidden.append(response_hidden_states(policy.trunk, batch)[0])
                masks.append(
                    owner_mask(batch.owner_ids, [self.spec.agent_index], batch.response_mask)
                )
                targets.append(returns[rows, : masks[-1].shape[1]].to(masks[-1].device))
        loss = float("nan")
        for _ in range(self.spec.value_steps):
            loss = self.value_head.fit(hidden, targets, masks)
        return loss

    # --- the update and the Stage-0 projection -------------------------------------------------

    @while_resident
    def update(
        self,
        trajectories: list[Trajectory],
        logp_cur: torch.Tensor | None,
        A: torch.Tensor,
        c: torch.Tensor,
        held_out: int = 0,
    ) -> UpdateResult:
        """`ppo_epochs` trust-region epochs on the agent's tokens (`update.run_update`); the
        last `held_out` trajectories are only measured by the KL check."""
        return run_update(self.policy, self.region, trajectories, logp_cur, A, c, held_out)

    @forward_pass
    def policy_states(self, trajectories: list[Trajectory]) -> PolicyStates:
        """This policy (π_cur of a swap) at the agent's response states of `trajectories`."""
        return distill.policy_states(self.policy, trajectories)

    @while_resident
    def distill(
        self,
        trajectories: list[Trajectory],
        current: PolicyStates,
        delta0: float,
        max_steps: int,
        lr: float,
        target_fraction: float = 1.0,
    ) -> DistillResult:
        """The Stage-0 projection towards π_cur (`distill.distill`)."""
        return distill.distill(
            self.policy, trajectories, current, delta0, max_steps, lr, target_fraction
        )

    # --- weights out ---------------------------------------------------------------------------

    def weight_buckets(self, bucket_mb: float) -> Iterator[TensorBucket]:
        """The weights in buckets of about `bucket_mb` MiB (`weights_out.weight_buckets`); a
        generator method, so that a Ray actor can stream it."""
        yield from weights_out.weight_buckets(self.policy, bucket_mb)

    def weights(self) -> dict[str, torch.Tensor]:
        """All the weights in one dict: for checks and saving."""
        return weights_out.all_weights(self.policy)

    def weight_manifest(self) -> list[TensorSpec]:
        """What `send_weights` sends, in order (the engines allocate from it)."""
        return weights_out.weight_manifest(self.policy)

    def free_address(self) -> str:
        """A host:port free on this learner's node, where a group can meet (weight transfer,
        or a sharded agent's ranks)."""
        return free_address()

    def open_weight_transfer(self, endpoint: TransferEndpoint) -> None:
        """Rank 0 forms the weight-transfer group with the engines at `endpoint` (leaving an
        earlier one); the other ranks only take part in `send_weights`' gathers."""
        if self.policy.group.rank != 0:
            return
        if self.sender is not None:
            self.sender.close()
        self.sender = WeightSender(endpoint)

    def send_weights(self, manifest: list[TensorSpec]) -> float:
        """Broadcast the current weights to the engines of the transfer group (they receive
        with `VLLMEngine.receive_weights`); the seconds it took."""
        try:
            return weights_out.send_weights(self.policy, self.sender, manifest)
        except Exception:
            self.sender = None  # closed: the next push forms the group again
            raise

    def save_pretrained(self, directory: str, storage: StorageMirror | None = None) -> str:
        """An HF directory loadable by transformers and vLLM (`weights_out.save_pretrained`);
        with `storage`, also uploaded there (by rank 0)."""
        weights_out.save_pretrained(self.policy, directory)
        return self._upload(directory, storage)

    # --- resume state --------------------------------------------------------------------------

    def save_state(self, path: str, storage: StorageMirror | None = None) -> str:
        """Write the resume state to `path` atomically (a checkpoint's learner file); with
        `storage`, also upload it there (by rank 0, once every rank has written)."""
        self.state.save(path)
        return self._upload(path, storage)

    @while_resident  # AdamW's state takes its parameters' dtype and device
    def load_state(self, path: str, storage: StorageMirror | None = None) -> None:
        """Load what `save_state` wrote; with `storage`, downloaded first if this node has no
        copy (written on a node since lost)."""
        if storage is not None:
            storage.fetch(path)
        self.state.load(path)

    def _upload(self, path: str, storage: StorageMirror | None) -> str:
        if storage is not None and self.policy.group.rank == 0:
            storage.upload(path)
        return path

    def reset(self) -> None:
        """Back to what the constructor made of `spec`: its weights, a fresh optimiser and β,
        the seed's RNG (a retry of stage 0). The old model is freed before the new one loads;
        a rank stays in its group."""
        spec = self.spec
        self.__dict__.clear()
        Learner.__init__(self, spec)

    def ready(self) -> bool:
        return True

    def incarnation(self) -> str:
        """The process this learner runs in: a new one after Ray restarted it (from its initial
        weights, whatever the run had trained)."""
        return PROCESS_ID
