"""The tiny model's tokenizer: byte-level BPE, Qwen chat markup, tool tags as single tokens."""

import pytest

from satseq.data import TOOL_PROMPT_FORMAT, build_messages, build_prompt, make_split
from satseq.models.corpus import tokenizer_corpus
from satseq.models.tokenizer import IM_END, train_tokenizer
from satseq.tool_tags import TOOL_TAGS


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(tokenizer_corpus(), vocab_size=512)


def test_special_tokens_follow_qwen(tokenizer):
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token == tokenizer.bos_token == "<|endoftext|>"
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [
        tokenizer.convert_tokens_to_ids("<|im_start|>")
    ]


def test_chat_template_renders_chatml(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without_generation_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert without_generation_prompt == prompt.removesuffix("<|im_start|>assistant\n")


def test_tool_tags_are_single_tokens_that_decoding_keeps(tokenizer):
    text = "<code>print(7+12-3)</code><interpreter>\n16\n</interpreter>\n\\boxed{16}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    for tag in TOOL_TAGS:
        assert tokenizer.convert_tokens_to_ids(tag) in ids
    # Not special: skip_special_tokens (vLLM's default) must leave them for the agent loop.
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode("1234", add_special_tokens=False))
    assert tokens == ["1", "2", "3", "4"]


def test_every_synthetic_prompt_and_solution_round_trips(tokenizer):
    problems = make_split("train", 50, style="mixed", solution_format="tool")
    for problem in problems:
        text = build_prompt(tokenizer, problem, TOOL_PROMPT_FORMAT) + problem.solution
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # The learned merges make the fixed instruction wording cheap: far fewer tokens than bytes.
    content = build_messages(problems[0])[0]["content"]
    assert len(tokenizer.encode(content, add_special_tokens=False)) < len(content) / 2


def test_text_outside_the_corpus_still_round_trips(tokenizer):
    text = "Ünïcode ∑ 数学 🙂 tabs\tand\r\nnewlines"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_training_is_deterministic(tokenizer):
    again = train_tokenizer(tokenizer_corpus(), vocab_size=512)
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
