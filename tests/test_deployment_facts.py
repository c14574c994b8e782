"""Each deployment fact is worked out in one place, `RunConfig` (satseq/config/schema.py), and
read from there: an agent's offload (`agent_offload(i)`), its learner ranks (`agent_workers(i)`),
whether the engines share the learners' devices (`engines_share_devices`) and whether stages
overlap (`overlapped`). Outside satseq/config/, no module derives one of them from the raw
fields again (the defect [4.5] found: the engines never slept for one agent's `idle_agents`,
because two modules read `trainer.offload` alone)."""

import ast
from pathlib import Path

import satseq

ROOT = Path(satseq.__file__).parent
RAW_FIELDS = {"offload", "workers", "workers_per_agent"}
"""Fields whose raw reads derive a fact: on `trainer`, or on an agent of `team.agents`."""


def raw_reads(source: str) -> list[str]:
    """The expressions of `source` that read a deployment fact's raw fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in RAW_FIELDS:
            owner = ast.unparse(node.value)
            if owner.endswith("trainer") or "agents[" in owner or owner == "agent":
                found.append(ast.unparse(node))
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr == "max_staleness"
            and ast.unparse(node.left.value).endswith("rollout")  # not a queue's own K
            and isinstance(node.ops[0], ast.Gt | ast.GtE)
        ):
            found.append(ast.unparse(node))
    return found


def test_no_module_outside_the_config_derives_a_deployment_fact_again():
    offenders = {
        str(path.relative_to(ROOT.parent)): reads
        for path in sorted(ROOT.rglob("*.py"))
        if "config" not in path.relative_to(ROOT).parts[:1]
        and (reads := raw_reads(path.read_text()))
    }
    assert offenders == {}


def test_the_check_sees_each_way_of_deriving_one():
    source = (
        "a = config.trainer.offload\n"
        "b = config.team.agents[i].workers or config.trainer.workers_per_agent\n"
        "c = config.rollout.max_staleness > 0\n"
        "d = agent.offload\n"
        "e = spec.workers + sandbox.workers + config.agent_workers(i)\n"  # not raw: allowed
        "f = self.max_staleness > 0\n"  # a rollout queue's own K: allowed
    )
    assert sorted(raw_reads(source)) == [
        "agent.offload",
        "config.rollout.max_staleness > 0",
        "config.team.agents[i].workers",
        "config.trainer.offload",
        "config.trainer.workers_per_agent",
    ]
