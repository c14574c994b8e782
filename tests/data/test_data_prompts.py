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
    with pytest.raises(DataError, match=r"has no chat template.*data\.prompt\.chat_template"):
        apply_chat_template(char_tokenizer(chat_template=None), build_messages(PROBLEM))


def test_a_base_model_with_no_template_takes_the_plain_format():
    """`data.prompt.chat_template: plain` (PLAIN_TEMPLATE): the system message, then
    `Question: ...`, and the prompt ends at `Answer:`."""
    from satseq.data.prompts import PLAIN_TEMPLATE

    base = char_tokenizer(chat_template=None)
    with pytest.raises(DataError, match=r"data\.prompt\.chat_template"):
        build_prompt(base, PROBLEM)
    plain = PromptFormat(
        answer_instruction="", system_prompt="Be brief.", chat_template=PLAIN_TEMPLATE
    )
    assert (
        build_prompt(base, PROBLEM, plain) == "Be brief.\n\nQuestion: What is 7 + 12 - 3?\nAnswer:"
    )


def test_a_template_override_and_its_variables_reach_the_prompt():
    """A template in place of the tokenizer's, reading a variable (as Qwen3's reads
    enable_thinking): both come from the prompt format."""
    template = (
        "{% for message in messages %}{{ message['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"
    )
    chat = char_tokenizer()
    thinking = PromptFormat(answer_instruction="", chat_template=template)
    assert build_prompt(chat, "2+2?", thinking) == "2+2?"
    quiet = PromptFormat(
        answer_instruction="",
        chat_template=template,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert build_prompt(chat, "2+2?", quiet) == "2+2?<no-think>"


def test_the_config_names_a_template_file_that_does_not_exist(tmp_path):
    from satseq.config import QUICKSTART, ConfigError, load_config
    from satseq.launch.settings import prompt_format

    with pytest.raises(ConfigError, match=r"data\.prompt\.chat_template.*missing\.jinja"):
        load_config(QUICKSTART, [f"data.prompt.chat_template={tmp_path}/missing.jinja"])
    template = tmp_path / "mine.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    config = load_config(QUICKSTART, [f"data.prompt.chat_template={template}"])
    assert prompt_format(config).chat_template == "{{ messages[0]['content'] }}"
