"""The code cites the project's design document as "design §n": every citation names a section
that docs/design.md has, and nothing cites a document outside the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
OUTSIDE = "DESIGN" + " §"  # the shared notes' name, spelt apart so this file does not match
CITATION = re.compile(r"design (§\d+(?:\s*[,;]\s*(?:and\s+)?§\d+)*)")


def cited_sections() -> dict[int, list[str]]:
    """section → where it is cited (file:line), over satseq/, tests/, bench/ and scripts/."""
    cited: dict[int, list[str]] = {}
    for folder in ("satseq", "tests", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".sh") or not path.is_file():
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                for match in CITATION.finditer(line):
                    for section in re.findall(r"§(\d+)", match.group(1)):
                        cited.setdefault(int(section), []).append(f"{path.name}:{number}")
    return cited


def test_every_citation_names_a_section_of_the_design():
    sections = {int(n) for n in re.findall(r"^## (\d+)\. .* \{#s\1\}$", DESIGN.read_text(), re.M)}
    assert sections == set(range(1, 13))
    cited = cited_sections()
    assert len(cited) >= 10 and sum(len(places) for places in cited.values()) > 150
    assert {n: places for n, places in cited.items() if n not in sections} == {}


def test_nothing_cites_the_design_notes_outside_the_repository():
    stale = [
        f"{path.relative_to(ROOT)}"
        for folder in ("satseq", "tests", "bench", "scripts", "docs", "configs")
        for path in (ROOT / folder).rglob("*")
        if path.is_file()
        and path.suffix in (".py", ".md", ".sh", ".yaml")
        and path != Path(__file__)
        and OUTSIDE in path.read_text()
    ]
    assert stale == []
