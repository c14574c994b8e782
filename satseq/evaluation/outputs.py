"""What `satseq eval` writes (design §8) and the table it prints.

`<output_dir>/predictions.jsonl`: one `ProblemResult.as_record()` per line;
`summary.json`: `TeamEvaluation.summary()` plus what was evaluated, and with the tool loop
  "tools": {"call_fraction", "calls_mean", "statuses"} (`actors.tool_loop.tool_usage`); with
  `--against DIR`, "against": the team vote paired with DIR's (`compare.PairedVotes`);
`inference_config.yaml`: the dataset, the agents' model dirs, the sampling, the resolved config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from rich.table import Table

from satseq.evaluation.team import TeamEvaluation
from satseq.files import write_text_atomically

PREDICTIONS = "predictions.jsonl"
SUMMARY = "summary.json"
INFERENCE_CONFIG = "inference_config.yaml"


def write_predictions(path: str | Path, evaluation: TeamEvaluation) -> None:
    """One JSON line per problem (also the format of validation_data/<stage>.jsonl)."""
    lines = (
        json.dumps(result.as_record(), ensure_ascii=False) + "\n" for result in evaluation.results
    )
    write_text_atomically(path, "".join(lines))


def write_outputs(
    output_dir: str | Path,
    evaluation: TeamEvaluation,
    inference_config: dict[str, Any],
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the three files; returns the summary as written, with `extras` ("tools",
    "against") added to it."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_predictions(out / PREDICTIONS, evaluation)
    summary = evaluation.summary() | {
        key: inference_config[key]
        for key in ("dataset", "checkpoint_dir")
        if key in inference_config
    }
    summary |= extras or {}
    write_text_atomically(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    write_text_atomically(out / INFERENCE_CONFIG, yaml.safe_dump(inference_config, sort_keys=False))
    return summary


def summary_table(summary: dict[str, Any], title: str = "satseq eval") -> Table:
    """The team vote next to each agent answering alone, with pass@k and avg@k."""
    table = Table(
        title=f"{title}: {summary['num_problems']} problems, "
        f"K={summary['samples_per_agent']} per agent"
    )
    for column in ("", "accuracy (vote)", "avg@k", "pass@k"):
        table.add_column(column, justify="right" if column else "left")
    table.add_row(
        "team",
        f"{summary['team_vote_accuracy']:.3f}",
        f"{summary['avg@k']:.3f}",
        f"{summary['pass@k']:.3f}",
        style="bold",
    )
    best = summary["best_agent"]["name"]
    for name, values in summary["per_agent"].items():
        table.add_row(
            f"{name} (best)" if name == best else name,
            f"{values['accuracy']:.3f}",
            f"{values['avg@k']:.3f}",
            f"{values['pass@k']:.3f}",
        )
    if summary.get("tools"):
        tools = summary["tools"]
        statuses = ", ".join(f"{status} {count}" for status, count in tools["statuses"].items())
        table.caption = (
            f"tools: {tools['call_fraction']:.0%} of samples ran code, "
            f"{tools['calls_mean']:.2f} runs per sample; sandbox: {statuses or 'no runs'}"
        )
    return table
