"""The `satseq` command (design §10): `satseq.cli.main:app`. One module per subcommand group,
each a thin shell over a library call; they share only `satseq.cli.common`."""
