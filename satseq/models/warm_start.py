"""The supervised warm start: a short AdamW run on prompt+solution pairs, loss on the solution.

It is deterministic on a given CPU: the seed fixes the initial weights (set by the caller under
`deterministic_torch`) and the order of examples, the thread count is fixed, and torch's
deterministic algorithms are on.

Tool solutions carry the sandbox's output (`<interpreter>\\n16\\n</interpreter>`). Those tokens
stay in the text, so the model learns to read them, but are left out of the loss: at rollout
time the agent loop writes them, not the model, and RL gives them response_mask = 0 (design §5).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from satseq.data import MathProblem, PromptFormat, build_prompt
from satseq.tool_tags import INTERPRETER_CLOSE, INTERPRETER_OPEN

# One thread: CPU matmul results can depend on the thread count, so it must be fixed, and a model
# this small gains little from a second thread, while on a busy machine (other actors, other
# tests) a second OpenMP thread waiting at barriers made steps up to 30x slower.
WARM_START_THREADS = 1
TOOL_OUTPUT_PATTERN = re.compile(
    f"({re.escape(INTERPRETER_OPEN)}.*?{re.escape(INTERPRETER_CLOSE)})", re.DOTALL
)


@dataclass(frozen=True)
class WarmStartConfig:
    """Hyperparameters of the warm start (all part of the built model's cache key)."""

    steps: int
    learning_rate: float
    batch_size: int = 32
    warmup_steps: int = 20  # then cosine decay to 0 at `steps`
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float = 1.0


@dataclass(frozen=True)
class SupervisedExample:
    """One prompt+solution sequence; `loss_mask[t]` is 1 where token t is a training target."""

    input_ids: list[int]
    loss_mask: list[int]


def supervised_examples(
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[MathProblem],
    prompt_formats: Sequence[PromptFormat],
) -> list[SupervisedExample]:
    """Every problem in every prompt format, answered by its solution and the eos token.

    The prompt and the solution are tokenized apart, as a rollout sees them: the prompt alone,
    then the generated tokens.
    """
    examples = []
    for problem in problems:
        if not problem.solution:
            raise ValueError(f"problem {problem.problem_id} has no solution to warm-start on")
        solution_ids, solution_mask = _solution_tokens(tokenizer, problem.solution)
        solution_ids.append(tokenizer.eos_token_id)
        solution_mask.append(1)
        for prompt_format in prompt_formats:
            prompt_text = build_prompt(tokenizer, problem, prompt_format)
            prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
            examples.append(
                SupervisedExample(
                    input_ids=prompt_ids + solution_ids,
                    loss_mask=[0] * len(prompt_ids) + solution_mask,
                )
            )
    return examples


def warm_start(
    model: PreTrainedModel,
    examples: Sequence[SupervisedExample],
    config: WarmStartConfig,
    pad_token_id: int,
    seed: int,
) -> list[float]:
    """Train `model` in place for `config.steps` AdamW steps; returns the loss of every step."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        betas=config.adam_betas,
        weight_decay=config.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _warmup_cosine(step, config.warmup_steps, config.steps)
    )
    batches = _shuffled_batches(examples, config.batch_size, random.Random(seed))
    model.train()
    losses = []
    for _ in range(config.steps):
        input_ids, labels = _collate(next(batches), pad_token_id)
        # No attention mask: padding sits on the right, after every real token, so causal
        # attention never lets a real token see it, and SDPA keeps its fast causal path.
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return losses


@contextmanager
def deterministic_torch(seed: int) -> Iterator[None]:
    """Seeded, deterministic, fixed-thread torch inside the block; the caller's settings and
    global RNG state come back afterwards."""
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(WARM_START_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(previous_threads)
        torch.use_deterministic_algorithms(previous_deterministic)


def _solution_tokens(
    tokenizer: PreTrainedTokenizerBase, solution: str
) -> tuple[list[int], list[int]]:
    """The solution's token ids, and a mask that is 0 on sandbox output, 1 elsewhere."""
    ids: list[int] = []
    mask: list[int] = []
    # re.split with a capturing group alternates: model text, tool output, model text, ...
    for index, piece in enumerate(TOOL_OUTPUT_PATTERN.split(solution)):
        piece_ids = tokenizer.encode(piece, add_special_tokens=False)
        written_by_model = index % 2 == 0
        ids.extend(piece_ids)
        mask.extend([int(written_by_model)] * len(piece_ids))
    return ids, mask


def _shuffled_batches(
    examples: Sequence[SupervisedExample], batch_size: int, rng: random.Random
) -> Iterator[list[SupervisedExample]]:
    """Endless batches; each pass over the examples is a fresh permutation."""
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            order.extend(rng.sample(range(len(examples)), len(examples)))
        yield [examples[order.pop()] for _ in range(batch_size)]


def _collate(
    batch: Sequence[SupervisedExample], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `input_ids` and `labels` ([batch, seq]); labels are -100 off the targets."""
    length = max(len(example.input_ids) for example in batch)
    input_ids = torch.full((len(batch), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    for row, example in enumerate(batch):
        ids = torch.tensor(example.input_ids, dtype=torch.long)
        input_ids[row, : len(ids)] = ids
        targets = torch.tensor(example.loss_mask, dtype=torch.bool)
        labels[row, : len(ids)] = torch.where(targets, ids, -100)
    return input_ids, labels


def _warmup_cosine(step: int, warmup_steps: int, total_steps: int) -> float:
    """Learning-rate multiplier: linear warmup, then cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
