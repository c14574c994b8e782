"""Weight sync (`TeamRuntime.push_weights`), on Ray: a learner (W ranks) pushes its weights
to the rollout actors' engines bucket by bucket, through the object store or broadcast over a
collective (`rollout.weight_sync`; gloo on the CPU, NCCL on GPUs). Prints seconds per push and
per GB for several bucket sizes, and the push as a share of a stage.

    python bench/bench_weight_sync.py                       # SmolLM2-135M, vLLM, W = 1 and 2
    python bench/bench_weight_sync.py --model builtin:tiny-carry-0 --engine hf

The baseline measured in the same run is the object store's largest bucket (the whole model in
one bucket, what the sync sent before buckets existed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from satseq.actors.learner_group import learner_actors
from satseq.actors.weight_transfer import bucket_plan
from satseq.cluster.recipes import RECIPES
from satseq.cluster.runtime import start_on_ray
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
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"model {args.model}, engine {args.engine}, {args.repeats} pushes each")
    print("| W | path | bucket MiB | buckets | GB | s per push | s per GB | vs baseline |")
    print("|---|---|---|---|---|---|---|---|")
    paths = args.paths if args.engine == "vllm" else ["object_store"]
    baseline = None
    for workers, path in ((w, p) for w in args.workers for p in paths):
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
            ],
        )
        runtime = start_on_ray(config, RECIPES["sat_seq"].learner_settings(config))
        learner = runtime.learners[0]
        for bucket_mb in sorted(args.bucket_mb, reverse=True):
            buckets = [
                ray.get(ref) for ref in runtime.calls.stream(learner, "weight_buckets", bucket_mb)
            ]
            size = sum(t.nbytes for bucket in buckets for t in bucket.values()) / 1e9
            runtime.bucket_mb = bucket_mb
            runtime.forget_weight_transfers()  # a collective's group forms again, at this size
            seconds = []
            for _ in range(args.repeats + 1):
                started = time.perf_counter()
                runtime.push_weights(0)
                seconds.append(time.perf_counter() - started)
            push = statistics.median(seconds[1:])  # the first push warms up
            count = (  # a collective cuts its buckets from the manifest
                len(bucket_plan(runtime.transfer_manifests[0], int(bucket_mb * 2**20)))
                if path == "collective"
                else len(buckets)
            )
            baseline = baseline or push
            print(
                f"| {workers} | {path} | {bucket_mb:g} | {count} | {size:.3f} | {push:.3f} "
                f"| {push / size:.2f} | {push / baseline:.2f}x |"
            )
        for actor in [*runtime.rollouts, *learner_actors(learner)]:
            ray.kill(actor)
        ray.util.remove_placement_group(ray.util.get_placement_group("satseq-team"))
    print(f"a push is {push / args.stage_s:.1%} of a {args.stage_s:g} s stage (last row)")


if __name__ == "__main__":
    main()
