"""`bench/gpu_sheet.py`, the one-GPU performance sheet, runs its CPU path here, every section on a
tiny random-init Qwen2, so that the first GPU lent to the project fills it in one call instead
of finding it broken; and it finds a card's peak bf16 FLOPs by the card's name."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_sheet_runs_every_section_on_the_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from learner_workload import lora_missing

    command = [sys.executable, "bench/gpu_sheet.py", "--device", "cpu", "--size", "tiny"]
    options = ["--repeats", "1", "--threads", "1", "--out", str(tmp_path)]
    subprocess.run([*command, *options], cwd=ROOT, check=True, capture_output=True)

    sheet = json.loads((tmp_path / "gpu_sheet.json").read_text())
    rows = sheet["sizes"]["tiny"]["rows"]
    lora = set() if lora_missing() else {"lora"}  # a LoRA agent's row where peft is installed
    assert set(rows) == {"bare", "bare+check", "bare+kl-check", "exact", "k3", "plain"} | lora
    assert all(row["seconds"] > 0 for row in rows.values())
    assert rows["exact"]["restore_s"] >= 0  # one backtrack's parts
    for mode in set(rows) - {
        "bare",
        "bare+check",
        "bare+kl-check",
    }:  # every timed update one accepted step
        assert rows[mode]["backtracks"] == 0 and rows[mode]["not_applied"] == 0, mode
    cycles = sheet["offload"]["cycles"]  # three learners onloaded and offloaded, two rounds
    assert [cycle["round"] for cycle in cycles] == [1, 1, 1, 2, 2, 2]
    assert sheet["fsdp2"]["backend"] == "gloo" and sheet["fsdp2"]["seconds"] > 0
    head = sheet["head"]  # the output layer's matmul: float32 is the accurate one
    assert head["float32_max_error"] < 1e-4 < head["bf16_max_error"]
    assert head["split_max_error"] < 1e-4  # the learner's product: float32-accurate
    table = (tmp_path / "gpu_sheet.md").read_text()
    assert "| tiny |" in table and "FSDP2 at W = 1 (gloo" in table


def test_a_card_is_found_by_its_name(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from gpu_sheet import datasheet_tflops

    assert datasheet_tflops("NVIDIA H100 80GB HBM3") == 989.4  # SXM
    assert datasheet_tflops("NVIDIA H100 PCIe") == 756.5
    assert datasheet_tflops("NVIDIA H200") == 989.4
    assert datasheet_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert datasheet_tflops("NVIDIA L40S") == 362.1
    assert datasheet_tflops("NVIDIA L4") == 121.0
    assert datasheet_tflops("a card nobody listed") is None
