"""Check a `satseq ...` command line against the real CLI (the typer app), without running it."""

import shlex
from typing import Any

import typer
from typer.exceptions import TyperException

from satseq.cli.main import app


class NotInCli(ValueError):
    """The command, an option or an argument does not exist in the `satseq` CLI."""


def parse_satseq_command(command: str | list[str]) -> tuple[str, dict[str, Any]]:
    """(`satseq train`, its parsed parameters) for `satseq train ARGS...`, parsed exactly as
    the CLI parses it; raises NotInCli where the CLI would refuse it."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv or argv[0] != "satseq":
        raise NotInCli(f"not a satseq command: {argv}")
    node = typer.main.get_command(app)
    path, args = ["satseq"], argv[1:]
    while hasattr(node, "get_command"):  # a command group: descend to the subcommand
        if not args:
            raise NotInCli(f"{' '.join(path)}: missing subcommand")
        name, args = args[0], args[1:]
        child = node.get_command(node.make_context(path[-1], [], resilient_parsing=True), name)
        if child is None:
            raise NotInCli(f"{' '.join(path)}: no such command {name!r}")
        node, path = child, [*path, name]
    try:
        context = node.make_context(" ".join(path), args)
    except TyperException as err:
        raise NotInCli(f"{' '.join(argv)}: {err}") from None
    return " ".join(path), context.params
