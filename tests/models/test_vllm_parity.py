"""vLLM loads the tiny model's directory unchanged and decodes greedily exactly as transformers.

vLLM runs in a subprocess (see vllm_greedy.py); both engines get the same prompt token ids.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from satseq.data import build_prompt, make_split

VLLM_SCRIPT = Path(__file__).with_name("vllm_greedy.py")
MAX_NEW_TOKENS = 48
# Where the engines pick different tokens, transformers' logits for the two must be this close:
# a numerical tie that float rounding may break either way, not a different model.
TIE_TOLERANCE = 1e-3

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


def vllm_greedy(model_dir: Path, prompt_token_ids: list[list[int]], work_dir: Path) -> dict:
    request, result = work_dir / "request.json", work_dir / "result.json"
    request.write_text(
        json.dumps({"prompt_token_ids": prompt_token_ids, "max_new_tokens": MAX_NEW_TOKENS})
    )
    command = [sys.executable, str(VLLM_SCRIPT), str(model_dir), str(request), str(result)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, f"vLLM failed:\n{completed.stderr[-4000:]}"
    return json.loads(result.read_text())


def transformers_greedy(model, prompt_ids: list[int]) -> list[int]:
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=MAX_NEW_TOKENS
        )
    return output[0, len(prompt_ids) :].tolist()


def logit_gap(model, prefix: list[int], token_a: int, token_b: int) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([prefix])).logits[0, -1]
    return abs(logits[token_a] - logits[token_b]).item()


def test_vllm_greedy_decoding_matches_transformers(tiny_model_dir, tiny_policy, tmp_path):
    model, tokenizer = tiny_policy
    problems = make_split("test", 8, difficulty=1, style="symbols")
    prompt_token_ids = [
        tokenizer.encode(build_prompt(tokenizer, problem), add_special_tokens=False)
        for problem in problems
    ]
    result = vllm_greedy(tiny_model_dir, prompt_token_ids, tmp_path)
    agreeing = 0
    for prompt_ids, vllm_ids in zip(prompt_token_ids, result["token_ids"], strict=True):
        hf_ids = transformers_greedy(model, prompt_ids)
        if hf_ids == vllm_ids:
            agreeing += 1
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(hf_ids, vllm_ids, strict=False)) if a != b),
            min(len(hf_ids), len(vllm_ids)),
        )
        assert at < min(len(hf_ids), len(vllm_ids)), (
            f"one engine stopped early: transformers {hf_ids}, vLLM {vllm_ids}"
        )
        gap = logit_gap(model, prompt_ids + hf_ids[:at], hf_ids[at], vllm_ids[at])
        assert gap < TIE_TOLERANCE, (
            f"greedy decodings diverge at new token {at}: transformers "
            f"{tokenizer.decode(hf_ids)!r}, vLLM {tokenizer.decode(vllm_ids)!r} (logit gap {gap})"
        )
    print(
        f"vLLM/transformers greedy agreement: {agreeing}/{len(problems)} prompts identical; "
        f"vLLM engine start-up {result['startup_seconds']:.1f}s"
    )
