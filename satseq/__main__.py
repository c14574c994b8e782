"""`python -m satseq ...`: the `satseq` command, for when the venv's bin/ is not on PATH."""

from satseq.cli.main import app

if __name__ == "__main__":
    app(prog_name="satseq")
