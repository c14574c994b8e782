"""`bench/bench_learning.py`: a run is a label, a config and overrides; its seeds' evaluations
are pooled from the records it writes, which hold all a report needs."""

import json
from pathlib import Path

import pytest

from satseq.algo.eval_metrics import paired_difference_interval, sign_test_p_value
from satseq.evaluation.compare import paired_votes

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


BASE = {f"p{i}": i < 3 for i in range(10)}  # the base team: right on 3 of 10


def record(bench, label: str, seed: int, right: set[int]) -> dict:
    """A seed's record as `train_and_score` writes it, for a team whose vote is right on the
    problems numbered in `right`."""
    after = {f"p{i}": i in right for i in range(10)}
    return {
        "run": label,
        "seed": seed,
        "vote": len(right) / 10,
        "best_agent": 0.4,
        "against": paired_votes(BASE, after, "base").as_record(),
        "tokens_generated": 100,
        "reward_per_stage": [0.1, 0.2],
        "team_votes": bench.packed_votes(after),
    }


def test_the_seeds_are_pooled_from_the_counts_and_runs_paired_by_the_votes_each_record_keeps(
    bench,
):
    records = [record(bench, "r", 0, {0, 1, 2, 5, 6}), record(bench, "r", 1, {0, 1, 7})]
    pooled = bench.pooled(records)  # (+2, 0) and (+1, −1)
    assert (pooled.gained, pooled.lost, pooled.num_problems) == (3, 1, 20)
    assert pooled.p_value == sign_test_p_value(3, 1)
    packed = records[0]["team_votes"]
    assert packed["correct"] == "1110011000"  # p0 … p9, the sorted ids' order
    assert bench.unpacked_votes(packed) == {str(i): i in {0, 1, 2, 5, 6} for i in range(10)}
    other = record(bench, "q", 0, {0}) | {"team_votes": bench.packed_votes({"x0": True})}
    with pytest.raises(ValueError, match="q seed 0 and r seed 0 were scored on other problems"):
        bench.pooled(records, [other])


def test_report_pools_the_records_that_several_invocations_wrote(
    bench, tmp_path, monkeypatch, capsys
):
    """`--report`: seeds trained one invocation at a time (maybe on other machines), read back
    from --results alone and pooled (and their curves drawn), without training anything; each
    run pooled with its intervals, and the first run against the others seed by seed where both
    records kept their votes (a record recovered from a results table keeps only counts)."""
    recovered = record(bench, "K0", 2, {0, 1, 2}) | {"team_votes": None, "reward_per_stage": None}
    records = [
        record(bench, "K0", 0, {0, 1, 2, 5, 6}),  # (+2, 0)
        record(bench, "K0", 1, {0, 1, 7}),  # (+1, −1)
        recovered,  # (0, 0)
        record(bench, "K1", 0, {0, 1, 2}),
        record(bench, "K1", 1, {0, 1, 2, 7}),
        record(bench, "K1", 2, {0, 1, 2, 3}),
    ]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr("sys.argv", ["bench_learning.py", "--report", "--results", str(results)])
    bench.main()
    out = capsys.readouterr().out
    assert "K0: pooled over 3: +0.067" in out and "3 gained, 1 lost" in out
    assert "vote on synthetic:test, base → after" in out  # records before --dataset: held out
    # K0: 11 of 30 right, Wilson [0.219, 0.545]; best agent 12 of 30; the change's interval
    low, high = paired_difference_interval(3, 1, 30)
    assert f"| K0 | 3 | 0.367 [0.219, 0.545] | +0.067 [{low:+.3f}, {high:+.3f}] (p 0.62) " in out
    assert "| 0.400 [0.246, 0.577] | 100 |" in out
    # K0 against K1 by seed: seed 0 {5, 6} gained; seed 1 {2} lost; seed 2 not paired
    assert "K0 against K1: pooled over 2: +0.050" in out and "2 gained, 1 lost" in out
    assert results.with_suffix(".png").stat().st_size > 0
    # records with no curve at all (recovered ones) draw no empty figure over a kept one
    results.write_text(json.dumps(recovered) + "\n")
    results.with_suffix(".png").unlink()
    bench.main()
    assert "K0: pooled over 1: +0.000" in capsys.readouterr().out
    assert not results.with_suffix(".png").exists()


def test_reuse_keeps_only_a_run_trained_with_the_same_settings_to_its_last_stage(bench, tmp_path):
    """`--reuse`: a seed's run is scored again only where an earlier invocation trained the
    same settings (when it saved and how it is scored aside) through every stage, or through
    the stage that spent its token budget."""
    from satseq.config import TRAIN_CONFIG, dump_config, load_config

    run = bench.parse_run("r=configs/smollm2.yaml trainer.stages=2")
    out = tmp_path / "r-seed3"
    out.mkdir()
    assert not bench.trained_already(out, run, 3)  # nothing there

    def trained(*overrides: str, stages: int = 2, tokens: int = 0) -> bool:
        config = load_config(Path("configs/smollm2.yaml"), ["trainer.stages=2", *overrides])
        (out / TRAIN_CONFIG).write_text(dump_config(config))
        line = json.dumps({"stage": 0, "tokens/run_total": tokens})
        (out / "metrics.jsonl").write_text(f"{line}\n" * stages)
        return bench.trained_already(out, run, 3)

    assert trained("trainer.seed=3", "trainer.save_every=1", "eval.synthetic_problems=300")
    assert not trained("trainer.seed=3", stages=1)  # cut off before its last stage
    assert not trained("trainer.seed=0")  # another seed
    assert not trained("trainer.seed=3", "trainer.lr=1e-5")  # another training
    run = bench.parse_run("r=configs/smollm2.yaml trainer.stages=2 trainer.max_generated_tokens=50")
    budget = ("trainer.seed=3", "trainer.max_generated_tokens=50")
    assert trained(*budget, stages=1, tokens=50)  # ended by its budget after stage 0
    assert not trained(*budget, stages=1, tokens=49)  # stopped before it was spent
    flags = bench.eval_flags(run)
    assert flags[flags.index("eval.synthetic_problems=1000") - 1] == "--set"
    assert "eval.merge_lora=false" in flags  # JSON, which YAML reads back as it was


def test_a_base_team_of_one_model_scored_greedily_is_scored_as_its_first_agent(bench):
    lora = bench.parse_run("lora=configs/smollm2_lora.yaml")
    (alone,) = bench.load_config(lora.config, bench.base_team_settings(lora)).team.agents
    assert alone.name == "a0" and alone.path == "builtin:smollm2-135m"
    sampled = bench.parse_run("lora=configs/smollm2_lora.yaml eval.temperature=0.6")
    other = bench.parse_run("two=configs/smollm2.yaml team.agents.1.path=builtin:tiny")
    chain = bench.parse_run("chain=configs/smollm2.yaml team.topology=chain")
    for run in (sampled, other, chain):  # each agent may answer differently: all of them scored
        assert bench.base_team_settings(run) == run.overrides
