"""Reading a tool-loop sample back: its turns (what /predict returns) and the tool usage of a
batch of samples (what training logs and `satseq eval` writes). One character per token here."""

from satseq.actors.tool_loop import ToolTurn, tool_turns
from satseq.actors.tool_usage import tool_usage
from satseq.actors.trajectory import Generation


def sample(*pieces: tuple[str, int]) -> Generation:
    """A response from (text, written by the model) pieces, one token per character."""
    token_ids = [ord(c) for text, _ in pieces for c in text]
    mask = [written for text, written in pieces for _ in text]
    return Generation(token_ids, "stop", response_mask=mask)


def decode(token_ids: list[int]) -> str:
    return "".join(map(chr, token_ids))


def test_a_tool_sample_splits_at_its_tool_output():
    generation = sample(
        ("<code>print(7+9)</code>", 1),
        ("<interpreter>\n16\n</interpreter>", 0),
        ("\\boxed{16}", 1),
    )
    assert tool_turns(generation, decode) == [
        ToolTurn("<code>print(7+9)</code>", ["print(7+9)"], "<interpreter>\n16\n</interpreter>"),
        ToolTurn("\\boxed{16}", [], None),
    ]


def test_a_sample_without_tool_output_is_one_turn():
    plain = Generation([ord(c) for c in "so 16"], "length")
    assert tool_turns(plain, decode) == [ToolTurn("so 16", [], None)]
    assert tool_turns(Generation([], "stop"), decode) == []


def test_tool_usage_counts_samples_that_ran_code():
    usage = tool_usage([0, 1, 3, 0], {"ok": 3, "timeout": 1})
    assert usage == {"call_fraction": 0.5, "calls_mean": 1.0, "statuses": {"ok": 3, "timeout": 1}}
    assert tool_usage([], {}) == {"call_fraction": 0.0, "calls_mean": 0.0, "statuses": {}}
