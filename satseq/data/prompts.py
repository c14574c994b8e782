"""Prompts: a problem becomes chat messages, and a tokenizer's chat template makes them text.

The user message is `[tool instruction]\\n\\n<problem>\\n<answer instruction>`. The default
answer instruction is the one the SPO recipe appends to every problem; `STEP_BY_STEP_INSTRUCTION`
is the common Qwen-math wording. A tool run adds a ReTool-style instruction before the problem,
telling the model how to call the sandbox (design §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from satseq.data.records import DataError, MathProblem
from satseq.tool_tags import CODE_CLOSE, CODE_OPEN, INTERPRETER_CLOSE, INTERPRETER_OPEN

SPO_ANSWER_INSTRUCTION = "The answer format must be: \\boxed{'The final answer goes here.'}"
STEP_BY_STEP_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TOOL_INSTRUCTION = (
    "Solve the following problem step by step. You may run Python code to help: write it "
    f"between {CODE_OPEN} and {CODE_CLOSE}, and a sandbox will run it and return what it prints "
    f"between {INTERPRETER_OPEN} and {INTERPRETER_CLOSE}. Print the values you need to see."
)


PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message.role == 'system' %}{{ message.content }}\n\n"
    "{% elif message.role == 'user' %}Question: {{ message.content }}\n"
    "{% else %}Answer: {{ message.content }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)
"""`data.prompt.chat_template: plain`, for base models that have no chat template: the system
message, then `Question: <user message>` and `Answer: <reply>` lines; the prompt ends with
`Answer:`, where the model's answer starts."""


@dataclass(frozen=True)
class PromptFormat:
    """How a problem is put to the model.

    `answer_instruction` follows the problem ("" for none); `system_prompt`, when set, is a
    system message; `tool_instruction`, when set, precedes the problem (use it for tool runs).
    `chat_template`: a Jinja template in place of the tokenizer's (`PLAIN_TEMPLATE` for a base
    model); `chat_template_kwargs`: variables the template reads (Qwen3's `enable_thinking`).
    """

    answer_instruction: str = SPO_ANSWER_INSTRUCTION
    system_prompt: str | None = None
    tool_instruction: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


DEFAULT_PROMPT_FORMAT = PromptFormat()
TOOL_PROMPT_FORMAT = PromptFormat(tool_instruction=TOOL_INSTRUCTION)


def build_messages(
    problem: MathProblem | str, prompt_format: PromptFormat = DEFAULT_PROMPT_FORMAT
) -> list[dict[str, str]]:
    """Chat messages (`[{role, content}]`) that ask `problem` in `prompt_format`."""
    problem_text = problem.problem if isinstance(problem, MathProblem) else problem
    content = problem_text
    if prompt_format.tool_instruction:
        content = f"{prompt_format.tool_instruction}\n\n{content}"
    if prompt_format.answer_instruction:
        content = f"{content}\n{prompt_format.answer_instruction}"
    messages = [{"role": "user", "content": content}]
    if prompt_format.system_prompt:
        messages.insert(0, {"role": "system", "content": prompt_format.system_prompt})
    return messages


def apply_chat_template(
    tokenizer: Any,
    messages: list[dict[str, str]],
    prompt_format: PromptFormat = DEFAULT_PROMPT_FORMAT,
) -> str:
    """The prompt text for `messages`, ending where the assistant's reply starts: the format's
    chat template if it has one, else the tokenizer's, with the format's template variables."""
    template = prompt_format.chat_template or getattr(tokenizer, "chat_template", None)
    if template is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DataError(
            f"tokenizer {name!r} has no chat template (a base model?): set "
            "data.prompt.chat_template to 'plain' (Question:/Answer: lines), a Jinja template, "
            "or a .jinja file"
        )
    return tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
        **prompt_format.chat_template_kwargs,
    )


def build_prompt(
    tokenizer: Any, problem: MathProblem | str, prompt_format: PromptFormat = DEFAULT_PROMPT_FORMAT
) -> str:
    """`build_messages` then `apply_chat_template`: the text a rollout engine is given."""
    return apply_chat_template(tokenizer, build_messages(problem, prompt_format), prompt_format)


def prompt_ids(
    tokenizer: Any, problem: MathProblem | str, prompt_format: PromptFormat = DEFAULT_PROMPT_FORMAT
) -> list[int]:
    """The token ids an engine is given for `problem`: chat template, no extra special tokens."""
    return tokenizer.encode(
        build_prompt(tokenizer, problem, prompt_format), add_special_tokens=False
    )
