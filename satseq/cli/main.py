"""The `satseq` command: every subcommand, registered on one Typer app."""

from __future__ import annotations

import typer

from satseq.cli.evaluate import evaluate
from satseq.cli.inspect import config_app, report
from satseq.cli.model import model_app
from satseq.cli.offline import offline_values_app
from satseq.cli.plan import plan_memory
from satseq.cli.sandbox import sandbox_app
from satseq.cli.serve import serve_team
from satseq.cli.train import train

app = typer.Typer(
    help="satseq: RL post-training of LLM teams (SAT-Seq, SPO, GRPO) on Ray, and serving the team.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("train")(train)
app.command("eval")(evaluate)
app.command("serve")(serve_team)
app.command("report")(report)
app.command("plan")(plan_memory)
app.add_typer(config_app, name="config")
app.add_typer(model_app, name="model")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(offline_values_app, name="offline-values")
