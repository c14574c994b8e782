"""Serving overhead: POST /predict through Ray Serve against the same engines called directly.

    python bench/bench_serve.py [--requests 30] [--rounds 3] [--max-tokens 24] [--clients 16]

The team is three copies of the quickstart tiny model (`builtin:tiny`), HF engines with one
thread each, greedy decoding, one sample per agent. Both paths do the same work per problem:
the prompt for each agent, each agent's generation, answer extraction, and the math-verify vote.

- direct: three `AgentModel`s in this process, asked one after another, then `team_vote`;
- served: `satseq serve`'s application (configs/serve.yaml scaling) on a local port, one client
  sending one request at a time (the ingress asks the three agents concurrently).

Rounds alternate the two paths, so that both see the same background load; each reports the
p50 and p99 latency and requests/s over all its rounds. The overhead is served − direct at the
p50, and the ratio served ÷ direct. A last run sends `--clients` concurrent clients to the
server (requests/s with Serve's batching), for scale.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import ray

from satseq.actors.trajectory import SamplingSpec
from satseq.config import load_config
from satseq.data import make_split, prompt_ids
from satseq.evaluation import team_vote
from satseq.launch import builders
from satseq.models import resolve_model_path
from satseq.serving.agent import AgentModel
from satseq.serving.app import start_server

AGENTS = ("a0", "a1", "a2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DirectTeam:
    """The served team's work, in this process, on the same engines and settings."""

    def __init__(self, team_dir: Path, config) -> None:
        self.scorer = builders.reward_scorer(config)
        self.prompt_format = builders.prompt_format(config)
        self.agents = {
            name: AgentModel(str(team_dir / name), self.scorer, "hf", {"num_threads": 1}, k)
            for k, name in enumerate(AGENTS)
        }

    def predict(self, problem: str, spec: SamplingSpec) -> str | None:
        answers = []
        for agent in self.agents.values():
            ids = prompt_ids(agent.tokenizer, problem, self.prompt_format)
            answers.append(agent.answer([(ids, 1, spec)])[0])
        vote = team_vote(
            [a for x in answers for a in x.answers],
            [lp for x in answers for lp in x.logprobs],
            self.scorer.answers_equivalent,
        )
        return vote.answer


def timed(call, problems: list[str]) -> tuple[list[float], list]:
    latencies, answers = [], []
    for problem in problems:
        started = time.perf_counter()
        answers.append(call(problem))
        latencies.append(time.perf_counter() - started)
    return latencies, answers


async def concurrent_rate(url: str, problems: list[str], clients: int, max_tokens: int) -> float:
    queue = list(problems)

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            problem = queue.pop()
            body = {"problem": problem, "temperature": 0, "max_tokens": max_tokens}
            (await http.post("/predict", json=body)).raise_for_status()

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return len(problems) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()

    config = load_config(
        overrides=[f"serve.max_tokens={args.max_tokens}", "serve.api_key_env=null"]
    )
    problems = [p.problem for p in make_split("test", args.requests, style="symbols")]
    spec = SamplingSpec(temperature=0.0, max_new_tokens=args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        team_dir = Path(tmp)
        for name in AGENTS:
            shutil.copytree(resolve_model_path("builtin:tiny"), team_dir / name)
        direct = DirectTeam(team_dir, config)
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
        url = start_server(config, team_dir, port=free_port())
        http = httpx.Client(base_url=url, timeout=300)

        def served(problem: str):
            body = {"problem": problem, "temperature": 0}
            response = http.post("/predict", json=body)
            response.raise_for_status()
            return response.json()["predicted_answer"]

        direct.predict(problems[0], spec), served(problems[0])  # warm up both paths
        results = {"direct": [], "served": []}
        for _ in range(args.rounds):
            direct_latencies, direct_answers = timed(lambda p: direct.predict(p, spec), problems)
            served_latencies, served_answers = timed(served, problems)
            assert direct_answers == served_answers, "greedy: both paths must give one answer"
            results["direct"] += direct_latencies
            results["served"] += served_latencies
        rate = asyncio.run(concurrent_rate(url, problems * 2, args.clients, args.max_tokens))

    print(f"{args.rounds} rounds x {args.requests} problems, greedy, max_tokens {args.max_tokens}")
    print(f"{'path':8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7}")
    for path, latencies in results.items():
        print(
            f"{path:8} {percentile(latencies, 0.5) * 1000:8.1f} "
            f"{percentile(latencies, 0.99) * 1000:8.1f} {len(latencies) / sum(latencies):7.2f}"
        )
    direct_p50 = percentile(results["direct"], 0.5)
    served_p50 = percentile(results["served"], 0.5)
    mean_ratio = statistics.mean(results["served"]) / statistics.mean(results["direct"])
    print(
        f"serve overhead at p50: {(served_p50 - direct_p50) * 1000:+.1f} ms, "
        f"ratio served/direct {served_p50 / direct_p50:.2f}x (mean ratio {mean_ratio:.2f}x)"
    )
    print(f"served, {args.clients} concurrent clients: {rate:.2f} req/s")


if __name__ == "__main__":
    main()
