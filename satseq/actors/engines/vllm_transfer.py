"""The engine workers' end of a gloo weight sync (`satseq.actors.weight_transfer`).

`GlooWeightTransferEngine` is vLLM's NCCL transfer engine with a torch gloo group in place of
PyNccl and one flat buffer per bucket. Registered with vLLM's transfer-engine factory as
`satseq-gloo`, it makes a CPU engine take a collective weight sync through the same vLLM calls
(and the same layer-by-layer reload) as a GPU engine on `nccl`.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLWeightTransferEngine,
    NCCLWeightTransferInitInfo,
    NCCLWeightTransferUpdateInfo,
)

from satseq.actors.weight_transfer import (
    GlooGroup,
    TransferBackend,
    manifest_from_update_info,
    receive_buckets,
)

GLOO_BACKEND = "satseq-gloo"


class GlooWeightTransferEngine(NCCLWeightTransferEngine):
    """vLLM's dense transfer engine over gloo: same init and update payloads, same lifecycle."""

    def init_transfer_engine(self, init_info: NCCLWeightTransferInitInfo) -> None:
        self.packed_buffer_size_bytes = init_info.packed_buffer_size_bytes
        rank = self.parallel_config.rank + init_info.rank_offset
        self.model_update_group = GlooGroup(
            init_info.master_address, init_info.master_port, rank, init_info.world_size
        )

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():  # the CPU has nothing in flight to wait for
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: NCCLWeightTransferUpdateInfo) -> None:
        if self.model_update_group is None:
            raise RuntimeError("the weight transfer group is not formed: init it first")
        manifest = manifest_from_update_info(
            {
                "names": update_info.names,
                "dtype_names": update_info.dtype_names,
                "shapes": update_info.shapes,
            }
        )
        buckets = receive_buckets(self.model_update_group, manifest, self.packed_buffer_size_bytes)
        for weights in buckets:
            self.model.load_weights(weights)


WeightTransferEngineFactory.register_engine(GLOO_BACKEND, GlooWeightTransferEngine)
VLLM_BACKENDS: dict[TransferBackend, str] = {"nccl": "nccl", "gloo": GLOO_BACKEND}
"""vLLM's `WeightTransferConfig.backend` for each satseq transfer backend."""
