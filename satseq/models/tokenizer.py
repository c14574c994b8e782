"""The embedded tiny model's tokenizer: a small byte-level BPE with Qwen-style chat markers.

It is trained (deterministically) on the synthetic task's own text, so the fixed instruction
wording of a prompt costs a few tokens instead of a hundred bytes, which makes the warm start and
rollouts several times faster. It is still byte-level, so any text round-trips (words-style
problems, code, odd Unicode in a user's prompt), and it splits every digit into its own token as
Qwen2 does, which is what lets a small model learn arithmetic digit by digit.

On top of the BPE vocabulary sit:

- special tokens, as in Qwen2: `<|endoftext|>` (bos and pad), `<|im_start|>` and `<|im_end|>`
  (the chat role markers; `<|im_end|>` ends an assistant turn, so it is the eos token);
- the tool tags of design §5 (`<code>`, `</code>`, `<interpreter>`, `</interpreter>`) as single
  added tokens. They are *not* special, so `skip_special_tokens` decoding keeps them in the text
  the agent loop parses, and "stop at `</code>`" can be a stop token id as well as a stop string.

The chat template is Qwen's ChatML without the default system prompt: a short prompt is a fast
prompt for a model this small.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from satseq.tool_tags import TOOL_TAGS

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
CHAT_ROLES = ("system", "user", "assistant")

# Qwen2's pre-tokenizer split: words, single digits (`\p{N}`), punctuation runs, whitespace.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of at most `vocab_size` learned tokens (plus the tool tags) on `corpus`.

    The BPE trainer is deterministic: the same corpus gives the same vocabulary and merges.
    """
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # Every byte is in the vocabulary, so no text is ever out of vocabulary.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    backend.train_from_iterator([*CHAT_ROLES, *corpus], trainer)
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        # Batched generation appends to the right, so prompts are padded on the left.
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
