"""Greedy-decode token-id prompts with vLLM; a script, run in its own process by the tests.

vLLM on CPU binds OpenMP threads and pins torch's thread count for the whole process, which
would leak into every later test, so it never runs inside the pytest process.

    python vllm_greedy.py MODEL_DIR REQUEST_JSON RESULT_JSON

REQUEST_JSON holds {"prompt_token_ids": [[...], ...], "max_new_tokens": N}; RESULT_JSON gets
{"token_ids": [[...], ...], "startup_seconds": s} (generated ids, eos included).
"""

import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    model_dir, request_path, result_path = sys.argv[1:4]
    request = json.loads(Path(request_path).read_text())
    # The engine core runs in this process: a second one would only add start-up time.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,  # no torch.compile: compiling costs more than a tiny model's run
        kv_cache_memory_bytes=64 * 2**20,
        seed=0,
    )
    startup_seconds = time.perf_counter() - started
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids in request["prompt_token_ids"]],
        SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"]),
        use_tqdm=False,
    )
    result = {
        "token_ids": [list(output.outputs[0].token_ids) for output in outputs],
        "startup_seconds": startup_seconds,
    }
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
