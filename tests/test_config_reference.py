"""docs/reference/config.md is the schema's own word: every key described, the page up to date."""

from pathlib import Path

from satseq.config.reference import REGENERATE, config_reference, missing_descriptions, sections

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md"


def test_every_key_and_section_has_a_description():
    # A new key needs `Field(..., description="what it sets, its units")`; a new section a
    # docstring. The page is for users, who cannot read the code.
    assert missing_descriptions() == []


def test_the_committed_page_is_what_the_schema_writes():
    assert PAGE.read_text() == config_reference(), f"the page is stale; run {REGENERATE}"


def test_every_section_is_a_heading_of_the_page():
    page = config_reference()
    keys = [section.key for section in sections() if section.key]
    assert "team.agents[i].lora" in keys and "algorithm.kl_ctrl" in keys
    for key in keys:
        assert f"\n## {key}\n" in page
