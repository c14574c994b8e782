"""Serving cost and batching: POST /predict through Ray Serve against the same engines in-process.

    python bench/bench_serve.py [--requests 30] [--rounds 3] [--max-tokens 24] [--clients 16]
                                [--output bench/results/serve.txt]

The team is three copies of the quickstart tiny model (`builtin:tiny`), HF engines with one
thread each, greedy decoding, one sample per agent. Both paths do the same work per problem:
the prompt for each agent, each agent's generation, answer extraction, and the math-verify vote.

- direct: three `AgentModel`s in this process, asked one after another, then `team_vote`, by
  one client (a request after the other);
- served: `satseq serve`'s application (configs/serve.yaml scaling) on a local port and a local
  Ray instance started as `satseq serve` starts it (`start_server`), first one
  client sending a request after the other, then `--clients` clients at once (the agents batch
  the requests that arrive together).

Each round sends every problem to the direct path and then to the served one, then runs the
concurrent clients, so that all three see the same background load. Reported: each
path's p50 and p99 latency and requests/s over all rounds, the serving overhead at the p50
(served − direct, in ms and as a ratio), the concurrent rate against the direct one, and the
mean batch size the agents' engine calls had under the concurrent clients (from /metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

import httpx
import ray

from satseq.actors.trajectory import SamplingSpec
from satseq.config import load_config
from satseq.data import make_split, prompt_ids
from satseq.evaluation import team_vote
from satseq.launch.settings import prompt_format, reward_scorer
from satseq.models import resolve_model_path
from satseq.serving.agent import AgentModel
from satseq.serving.app import start_server

AGENTS = ("a0", "a1", "a2")
RESULTS = Path(__file__).resolve().parent / "results" / "serve.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DirectTeam:
    """The served team's work, in this process, on the same engines and settings."""

    def __init__(self, team_dir: Path, config, spec: SamplingSpec) -> None:
        self.scorer = reward_scorer(config)
        self.prompt_format = prompt_format(config)
        self.spec = spec
        self.agents = {
            name: AgentModel(str(team_dir / name), self.scorer, "hf", {"num_threads": 1}, k)
            for k, name in enumerate(AGENTS)
        }

    def predict(self, problem: str) -> str | None:
        answers = []
        for agent in self.agents.values():
            ids = prompt_ids(agent.tokenizer, problem, self.prompt_format)
            answers.append(agent.answer([(ids, 1, self.spec)])[0])
        vote = team_vote(
            [a for x in answers for a in x.answers],
            [lp for x in answers for lp in x.logprobs],
            self.scorer.answers_equivalent,
        )
        return vote.answer


class ServedTeam:
    """/predict of the served team, greedy, with the server's default max_tokens."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=300)

    def predict(self, problem: str) -> str | None:
        response = self.http.post("/predict", json={"problem": problem, "temperature": 0})
        response.raise_for_status()
        return response.json()["predicted_answer"]

    async def concurrent_seconds(self, problems: list[str], clients: int) -> float:
        """Seconds for `clients` clients at once to get every answer to `problems`."""
        queue = list(problems)

        async def client(http: httpx.AsyncClient) -> None:
            while queue:
                body = {"problem": queue.pop(), "temperature": 0}
                (await http.post("/predict", json=body)).raise_for_status()

        started = time.perf_counter()
        async with httpx.AsyncClient(base_url=self.url, timeout=300) as http:
            await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - started

    def batch_totals(self) -> tuple[float, float]:
        """(engine calls' batch sizes summed over the agents' answers, number of answers)."""
        text = self.http.get("/metrics").text
        sums = re.findall(r"^satseq_agent_batch_size_sum\{[^}]*\} (\S+)$", text, re.M)
        counts = re.findall(r"^satseq_agent_batch_size_count\{[^}]*\} (\S+)$", text, re.M)
        return sum(map(float, sums)), sum(map(float, counts))


def timed(paths: dict, problems: list[str]) -> tuple[dict[str, list[float]], dict[str, list]]:
    """Each problem on each path in turn (so that both see the same background load): the
    latencies and answers per path."""
    latencies = {name: [] for name in paths}
    answers = {name: [] for name in paths}
    for problem in problems:
        for name, predict in paths.items():
            started = time.perf_counter()
            answers[name].append(predict(problem))
            latencies[name].append(time.perf_counter() - started)
    return latencies, answers


def report(args, latencies: dict[str, list[float]], concurrent_rate: float, batch: float) -> str:
    direct, served = latencies["direct"], latencies["served"]
    direct_p50, served_p50 = percentile(direct, 0.5), percentile(served, 0.5)
    direct_rate = len(direct) / sum(direct)
    lines = [
        f"{args.rounds} rounds x {args.requests} problems, greedy, max_tokens "
        f"{args.max_tokens}, {os.cpu_count()} CPUs, load average at the end "
        f"{os.getloadavg()[0]:.1f}",
        f"{'path':28} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7}",
    ]
    for path, values in latencies.items():
        lines.append(
            f"{path + ', 1 client':28} {percentile(values, 0.5) * 1000:8.1f} "
            f"{percentile(values, 0.99) * 1000:8.1f} {len(values) / sum(values):7.2f}"
        )
    lines += [
        f"{f'served, {args.clients} clients':28} {'':8} {'':8} {concurrent_rate:7.2f}",
        f"serve overhead at p50: {(served_p50 - direct_p50) * 1000:+.1f} ms "
        f"(served/direct {served_p50 / direct_p50:.2f}x)",
        f"{args.clients} served clients / 1 direct client: "
        f"{concurrent_rate / direct_rate:.2f}x the requests/s",
        f"mean engine batch under {args.clients} clients: {batch:.1f} requests",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="per path per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    config = load_config(
        overrides=[f"serve.max_tokens={args.max_tokens}", "serve.api_key_env=null"]
    )
    problems = [p.problem for p in make_split("test", args.requests, style="symbols")]
    concurrent_problems = problems * 2
    spec = SamplingSpec(temperature=0.0, max_new_tokens=args.max_tokens)
    latencies = {"direct": [], "served": []}
    concurrent_s = batch_sum = batch_count = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        team_dir = Path(tmp)
        for name in AGENTS:
            shutil.copytree(resolve_model_path("builtin:tiny"), team_dir / name)
        direct = DirectTeam(team_dir, config, spec)
        served = ServedTeam(start_server(config, team_dir, port=free_port()))
        direct.predict(problems[0]), served.predict(problems[0])  # warm up both paths
        asyncio.run(served.concurrent_seconds(problems[: args.clients], args.clients))
        for _ in range(args.rounds):
            round_latencies, answers = timed(
                {"direct": direct.predict, "served": served.predict}, problems
            )
            assert answers["direct"] == answers["served"], "greedy: both paths, one answer"
            for path, values in round_latencies.items():
                latencies[path] += values
            sum_before, count_before = served.batch_totals()
            concurrent_s += asyncio.run(
                served.concurrent_seconds(concurrent_problems, args.clients)
            )
            sum_after, count_after = served.batch_totals()
            batch_sum += sum_after - sum_before
            batch_count += count_after - count_before
        ray.shutdown()
    concurrent_rate = args.rounds * len(concurrent_problems) / concurrent_s
    text = report(args, latencies, concurrent_rate, batch_sum / batch_count)
    print(text, end="")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)


if __name__ == "__main__":
    main()
