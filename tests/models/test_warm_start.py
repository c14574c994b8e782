"""Warm-start data: loss on the model's own tokens only, never on prompts or sandbox output."""

import itertools

import torch

from satseq.data import TOOL_PROMPT_FORMAT, build_prompt
from satseq.models.corpus import (
    tokenizer_corpus,
    warm_start_problems,
    warm_start_prompt_formats,
)
from satseq.models.tokenizer import train_tokenizer
from satseq.models.warm_start import (
    SupervisedExample,
    _collate,
    _warmup_cosine,
    supervised_examples,
)


def tokenizer():
    return train_tokenizer(tokenizer_corpus(), vocab_size=512)


def test_tool_examples_mask_prompt_and_interpreter_output():
    tok = tokenizer()
    problem = warm_start_problems("tool")[0]
    example = supervised_examples(tok, [problem], [TOOL_PROMPT_FORMAT])[0]
    prompt_length = len(tok.encode(build_prompt(tok, problem, TOOL_PROMPT_FORMAT)))
    assert example.loss_mask[:prompt_length] == [0] * prompt_length
    targets = [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
    ignored = [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if not m]
    answer = problem.answer
    expression = problem.meta["expression"]
    assert tok.decode(targets) == f"<code>print({expression})</code>\n\\boxed{{{answer}}}<|im_end|>"
    assert tok.decode(ignored[prompt_length:]) == f"<interpreter>\n{answer}\n</interpreter>"


def test_steps_examples_cover_every_problem_in_every_prompt_format():
    tok = tokenizer()
    problems = warm_start_problems("steps")[:3]
    formats = warm_start_prompt_formats("steps")
    examples = supervised_examples(tok, problems, formats)
    assert len(examples) == len(problems) * len(formats) == 6
    first = examples[0]
    targets = [t for t, m in zip(first.input_ids, first.loss_mask, strict=True) if m]
    assert tok.decode(targets) == problems[0].solution + "<|im_end|>"


def test_collate_pads_right_and_labels_only_targets():
    batch = [
        SupervisedExample(input_ids=[5, 6, 7], loss_mask=[0, 1, 1]),
        SupervisedExample(input_ids=[8, 9], loss_mask=[0, 1]),
    ]
    input_ids, labels = _collate(batch, pad_token_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert labels.tolist() == [[-100, 6, 7], [-100, 9, -100]]
    assert input_ids.dtype == labels.dtype == torch.long


def test_learning_rate_warms_up_then_decays_to_zero():
    multipliers = [_warmup_cosine(step, warmup_steps=4, total_steps=12) for step in range(13)]
    assert multipliers[:4] == [0.25, 0.5, 0.75, 1.0]
    assert multipliers[4] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(multipliers[4:]))
    assert multipliers[12] == 0.0
