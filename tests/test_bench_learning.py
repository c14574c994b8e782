"""`bench/bench_learning.py`: a run is a label, a config and overrides; its seeds' evaluations
are pooled from the files `satseq eval` writes."""

import json
from pathlib import Path

import pytest

from satseq.algo.eval_metrics import paired_difference_interval, sign_test_p_value
from tests.evaluation.test_compare import eval_dir

ROOT = Path(__file__).parent.parent


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import bench_learning

    return bench_learning


def test_a_run_is_a_label_a_config_and_yaml_overrides(bench):
    run = bench.parse_run(
        "alone=configs/smollm2.yaml team.agents=[{name: a0, path: builtin:smollm2-135m}] "
        "trainer.stages=2"
    )
    assert (run.label, run.config) == ("alone", Path("configs/smollm2.yaml"))
    assert run.overrides == [
        "team.agents=[{name: a0, path: builtin:smollm2-135m}]",
        "trainer.stages=2",
    ]
    with pytest.raises(Exception, match="LABEL=CONFIG"):
        bench.parse_run("configs/smollm2.yaml")


def test_the_seeds_are_pooled_from_the_eval_files(bench, tmp_path):
    base = eval_dir(tmp_path, "base", {str(i): i < 3 for i in range(10)})
    records = []
    for seed, right in enumerate([{0, 1, 2, 5, 6}, {0, 1, 7}]):  # (+2, 0) and (+1, −1)
        after = eval_dir(tmp_path, f"after{seed}", {str(i): i in right for i in range(10)})
        records.append(
            {"run": "r", "seed": seed, "eval_dir": str(after), "base_eval_dir": str(base)}
        )
    pooled = bench.pooled(records)
    assert (pooled.gained, pooled.lost, pooled.num_problems) == (3, 1, 20)
    assert pooled.p_value == sign_test_p_value(3, 1)


def test_report_pools_the_records_that_several_invocations_wrote(
    bench, tmp_path, monkeypatch, capsys
):
    """`--report`: seeds trained one invocation at a time, read back from --results and pooled
    (and their curves drawn), without training anything; each run pooled with its intervals,
    and the first run against the others seed by seed."""
    base = eval_dir(tmp_path, "base", {str(i): i < 3 for i in range(10)})
    results = tmp_path / "results.jsonl"
    lines = []
    runs = {"K0": [{0, 1, 2, 5, 6}, {0, 1, 7}], "K1": [{0, 1, 2}, {0, 1, 2, 7}]}
    for label, seeds in runs.items():  # K0: (+2, 0) and (+1, −1); K1: (0, 0) and (+1, 0)
        for seed, right in enumerate(seeds):
            after = eval_dir(tmp_path, f"{label}{seed}", {str(i): i in right for i in range(10)})
            against = {"accuracy_before": 0.3, "gained": 0, "lost": 0, "p_value": 1.0}
            record = {"run": label, "seed": seed, "vote": len(right) / 10, "best_agent": 0.4}
            record |= {"against": against, "tokens_generated": 100, "reward_per_stage": [0.1, 0.2]}
            lines.append(json.dumps(record | {"eval_dir": str(after), "base_eval_dir": str(base)}))
    results.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("sys.argv", ["bench_learning.py", "--report", "--results", str(results)])
    bench.main()
    out = capsys.readouterr().out
    assert "K0: pooled over 2: +0.100" in out and "3 gained, 1 lost" in out
    assert "vote on synthetic:test, base → after" in out  # records before --dataset: held out
    # K0: 8 of 20 right, Wilson [0.219, 0.613]; best agent 4 + 4 of 20; the change's interval
    low, high = paired_difference_interval(3, 1, 20)
    assert f"| K0 | 2 | 0.400 [0.219, 0.613] | +0.100 [{low:+.3f}, {high:+.3f}] (p 0.62) " in out
    assert "| 0.400 [0.219, 0.613] | 100 |" in out
    # K0 against K1 by seed: seed 0 {5, 6} gained; seed 1 {2} lost, nothing gained
    assert "K0 against K1: pooled over 2: +0.050" in out and "2 gained, 1 lost" in out
    assert results.with_suffix(".png").stat().st_size > 0


def test_reuse_keeps_only_a_run_trained_with_the_same_settings_to_its_last_stage(bench, tmp_path):
    """`--reuse`: a seed's run is scored again only where an earlier invocation trained the
    same settings (when it saved and how it is scored aside) through every stage."""
    from satseq.config import TRAIN_CONFIG, dump_config, load_config

    run = bench.parse_run("r=configs/smollm2.yaml trainer.stages=2")
    out = tmp_path / "r-seed3"
    out.mkdir()
    assert not bench.trained_already(out, run, 3)  # nothing there

    def trained(*overrides: str, stages: int = 2) -> bool:
        config = load_config(Path("configs/smollm2.yaml"), ["trainer.stages=2", *overrides])
        (out / TRAIN_CONFIG).write_text(dump_config(config))
        (out / "metrics.jsonl").write_text('{"stage": 0}\n' * stages)
        return bench.trained_already(out, run, 3)

    assert trained("trainer.seed=3", "trainer.save_every=1", "eval.synthetic_problems=300")
    assert not trained("trainer.seed=3", stages=1)  # cut off before its last stage
    assert not trained("trainer.seed=0")  # another seed
    assert not trained("trainer.seed=3", "trainer.lr=1e-5")  # another training
    flags = bench.eval_flags(run)
    assert flags[flags.index("eval.synthetic_problems=1000") - 1] == "--set"
    assert "eval.merge_lora=false" in flags  # JSON, which YAML reads back as it was
