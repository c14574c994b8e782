"""Prompt building with a chat template, on a character-level tokenizer the test builds itself."""

import string

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from satseq.data import (
    DEFAULT_PROMPT_FORMAT,
    SPO_ANSWER_INSTRUCTION,
    STEP_BY_STEP_INSTRUCTION,
    TOOL_INSTRUCTION,
    TOOL_PROMPT_FORMAT,
    DataError,
    MathProblem,
    PromptFormat,
    apply_chat_template,
    build_messages,
    build_prompt,
)

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PROBLEM = MathProblem(problem_id="p0", problem="What is 7 + 12 - 3?", answer="16")


def char_tokenizer(chat_template=CHAT_TEMPLATE):
    """One token per character, as the embedded tiny model's tokenizer has."""
    vocab = {token: index for index, token in enumerate(["<unk>", *string.printable])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", chat_template=chat_template
    )


def test_the_default_prompt_appends_the_spo_answer_instruction():
    tokenizer = char_tokenizer()
    prompt = build_prompt(tokenizer, PROBLEM)
    assert prompt == f"<|user|>What is 7 + 12 - 3?\n{SPO_ANSWER_INSTRUCTION}\n<|assistant|>"
    # Every character is in the vocabulary: the prompt is token-for-character.
    token_ids = tokenizer(prompt)["input_ids"]
    assert len(token_ids) == len(prompt)
    assert tokenizer.unk_token_id not in token_ids


def test_a_system_prompt_and_another_instruction_are_used():
    prompt_format = PromptFormat(
        answer_instruction=STEP_BY_STEP_INSTRUCTION, system_prompt="You are good at sums."
    )
    assert build_messages(PROBLEM, prompt_format) == [
        {"role": "system", "content": "You are good at sums."},
        {"role": "user", "content": f"What is 7 + 12 - 3?\n{STEP_BY_STEP_INSTRUCTION}"},
    ]
    assert build_prompt(char_tokenizer(), PROBLEM, prompt_format).startswith(
        "<|system|>You are good at sums.\n<|user|>What is 7 + 12 - 3?\nPlease reason step by step"
    )


def test_an_empty_instruction_leaves_the_raw_problem():
    messages = build_messages("What is 2 + 2?", PromptFormat(answer_instruction=""))
    assert messages == [{"role": "user", "content": "What is 2 + 2?"}]


def test_the_tool_prompt_explains_code_and_interpreter_tags_before_the_problem():
    [message] = build_messages(PROBLEM, TOOL_PROMPT_FORMAT)
    assert message["content"] == (
        f"{TOOL_INSTRUCTION}\n\nWhat is 7 + 12 - 3?\n{SPO_ANSWER_INSTRUCTION}"
    )
    for tag in ("<code>", "</code>", "<interpreter>", "</interpreter>"):
        assert tag in TOOL_INSTRUCTION


def test_a_problem_and_its_text_give_the_same_messages():
    assert build_messages(PROBLEM) == build_messages(PROBLEM.problem, DEFAULT_PROMPT_FORMAT)


def test_a_tokenizer_without_a_chat_template_is_refused_with_advice():
    with pytest.raises(DataError, match=r"has no chat template.*tokenizer\.chat_template"):
        apply_chat_template(char_tokenizer(chat_template=None), build_messages(PROBLEM))
