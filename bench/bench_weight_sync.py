"""Weight sync (`TeamRuntime.weight_sync`), on Ray: a learner (W ranks) pushes its weights
to the rollout actors' engines bucket by bucket, through the object store or broadcast over a
collective (`rollout.weight_sync`; gloo on the CPU, NCCL on GPUs). Prints seconds per push and
per GB for several bucket sizes, and the push as a share of a stage. Then a LoRA agent's push
(design §12): its adapter alone, one bucket through the object store into the engine it shares
with the other LoRA agents, as a new adapter version (`--lora-ranks`).

    python bench/bench_weight_sync.py                       # SmolLM2-135M, vLLM, W = 1 and 2
    python bench/bench_weight_sync.py --model builtin:tiny-carry-0 --engine hf
    python bench/bench_weight_sync.py --workers 1 --paths object_store --lora-ranks 16 64

The baseline measured in the same run is the object store's largest bucket (the whole model in
one bucket, what the sync sent before buckets existed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from satseq.actors.learner import Learner
from satseq.actors.weight_transfer import bucket_plan
from satseq.cluster.recipes import RECIPES
from satseq.cluster.team import start_on_ray
from satseq.config import QUICKSTART, load_config

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[16, 64, 1e6])
    parser.add_argument("--paths", nargs="+", default=["object_store", "collective"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stage-s", type=float, default=60.0, help="a stage, for the share")
    parser.add_argument("--lora-ranks", type=int, nargs="*", default=[16])
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"model {args.model}, engine {args.engine}, {args.repeats} pushes each")
    print("| W | path | bucket MiB | buckets | GB | s per push | s per GB | vs baseline |")
    print("|---|---|---|---|---|---|---|---|")
    paths = args.paths if args.engine == "vllm" else ["object_store"]
    baseline = None
    cases = [(w, p, None) for w in args.workers for p in paths]
    cases += [(1, "object_store", rank) for rank in args.lora_ranks]
    for workers, path, rank in cases:
        config = load_config(
            QUICKSTART,
            [
                f"team.agents=[{{name: a0, path: '{args.model}'}}]",
                f"rollout.engine={args.engine}",
                f"trainer.workers_per_agent={workers}",
                f"trainer.resources.num_cpus={1 / (workers + 1)}",
                f"rollout.resources.num_cpus={1 / (workers + 1)}",
                "rollout.num_actors=1",
                f"rollout.weight_sync={path}",
                *([f"trainer.lora.rank={rank}"] if rank else []),
            ],
        )
        runtime = start_on_ray(config, RECIPES["sat_seq"].learner_settings(config))
        learner = runtime.team.learners[0]
        sizes = sorted(args.bucket_mb, reverse=True)
        for bucket_mb in sizes[:1] if rank else sizes:  # an adapter goes in one bucket
            buckets = [
                ray.get(ref)
                for ref in runtime.calls.stream(learner, Learner.weight_buckets, bucket_mb)
            ]
            size = sum(t.nbytes for bucket in buckets for t in bucket.values()) / 1e9
            runtime.weight_sync.bucket_mb = bucket_mb
            runtime.weight_sync.forget()  # a collective's group forms again, at this size
            seconds = []
            for _ in range(args.repeats + 1):
                started = time.perf_counter()
                runtime.weight_sync.push(0)
                seconds.append(time.perf_counter() - started)
            push = statistics.median(seconds[1:])  # the first push warms up
            count = (  # a collective cuts its buckets from the manifest
                len(bucket_plan(runtime.weight_sync.manifests[0], int(bucket_mb * 2**20)))
                if path == "collective"
                else len(buckets)
            )
            baseline = baseline or push
            what = f"{path}, adapter r{rank}" if rank else path
            print(
                f"| {workers} | {what} | {bucket_mb:g} | {count} | {size:.3f} | {push:.3f} "
                f"| {push / size:.2f} | {push / baseline:.2f}x |"
            )
        for actor in [*runtime.team.rollouts, *learner.actors]:
            ray.kill(actor)
        ray.util.remove_placement_group(ray.util.get_placement_group("satseq-team"))
    print(f"a push is {push / args.stage_s:.1%} of a {args.stage_s:g} s stage (last row)")


if __name__ == "__main__":
    main()
