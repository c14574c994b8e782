"""Each deployment fact is worked out in one place, the run's `TeamPlan`
(satseq/config/team_plan.py, built once as `RunConfig.plan`), and read from there: an agent's
offload and learner ranks, whether the engines share the learners' devices, whether stages
overlap, the weight-transfer backend, which LoRA agents may share a learner process, and the
engines' options. No other module derives one from the raw fields again (the defect [4.5]
found: the engines never slept for one agent's `idle_agents`, because two modules read
`trainer.offload` alone), and the config's checks, placement, the launch settings, the memory
plan and the runtime read the plan."""

import ast
from pathlib import Path

import satseq
from satseq.config import QUICKSTART, load_config
from satseq.config.team_plan import TeamPlan

ROOT = Path(satseq.__file__).parent
PLAN = ROOT / "config" / "team_plan.py"
RAW_FIELDS = {
    "offload": ("trainer", "agent"),
    "workers": ("trainer", "agent"),
    "workers_per_agent": ("trainer", "agent"),
    "share_lora_learners": ("trainer",),
    "weight_sync": ("rollout",),
}
"""Fields whose raw reads derive a fact, and their owners: `trainer`, an agent of
`team.agents`, or `rollout`."""
FACTS = {
    "agent_offload",
    "agent_workers",
    "overlapped",
    "engines_share_devices",
    "shares_devices",
    "records_behaviour_logprobs",
    "vllm_on_gpus",
    "weight_transfer",
    "engine_options",
}
"""The facts' names: only the plan defines one (the launch settings' `engine_options` copies
the plan's)."""
READERS = [
    "config/schema.py",
    "cluster/placement.py",
    "cluster/learner_specs.py",
    "cluster/team.py",
    "cluster/recipes/stage_rollouts.py",
    "launch/settings.py",
    "launch/memory_plan.py",
]
"""The modules that use a fact: the config's checks, placement, the learners' specs and hosts,
the runtime's start, the rollout queue, the launch settings and the memory plan."""


def _owned_by(owner: str, kinds: tuple[str, ...]) -> bool:
    """Whether `owner` is a config section of `kinds` (not the plan's agents)."""
    if "plan" in owner.replace("[", ".").split("."):
        return False
    agent = owner == "agent" or "agents[" in owner
    return ("agent" in kinds and agent) or any(owner.endswith(kind) for kind in kinds)


def raw_reads(source: str) -> list[str]:
    """The expressions of `source` that read a deployment fact's raw fields."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in RAW_FIELDS:
            if _owned_by(ast.unparse(node.value), RAW_FIELDS[node.attr]):
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


def defined_facts(source: str) -> set[str]:
    """The facts `source` defines a function or property of."""
    return {
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in FACTS
    }


def reads_the_plan(source: str) -> bool:
    """Whether `source` reads a `TeamPlan`: `<config>.plan`, or the class by name."""
    return any(
        (isinstance(node, ast.Attribute) and node.attr == "plan")
        or (isinstance(node, ast.Name) and node.id == "TeamPlan")
        or (isinstance(node, ast.alias) and node.name == "TeamPlan")
        for node in ast.walk(ast.parse(source))
    )


def modules() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT.parent)): path.read_text() for path in sorted(ROOT.rglob("*.py"))
    }


def test_no_module_but_the_plan_derives_a_deployment_fact():
    offenders = {
        path: reads
        for path, source in modules().items()
        if path != str(PLAN.relative_to(ROOT.parent)) and (reads := raw_reads(source))
    }
    assert offenders == {}
    assert raw_reads(PLAN.read_text())  # the plan itself reads them


def test_only_the_plan_defines_a_fact():
    defined = {
        path: facts for path, source in modules().items() if (facts := defined_facts(source))
    }
    assert defined == {
        "satseq/config/team_plan.py": {"shares_devices", "weight_transfer"},
        "satseq/launch/settings.py": {"engine_options"},  # the plan's, copied
    }
    assert "return dict(config.plan.engine_options)" in (ROOT / "launch/settings.py").read_text()


def test_the_checks_placement_launch_and_runtime_read_the_plan():
    assert [path for path in READERS if not reads_the_plan((ROOT / path).read_text())] == []


def test_the_plan_is_built_once_and_a_copy_builds_its_own():
    config = load_config(QUICKSTART, ["trainer.offload=idle_agents"])
    assert isinstance(config.plan, TeamPlan) and config.plan is config.plan
    assert config.plan.engines_share_devices
    awake = config.model_copy(
        update={"trainer": config.trainer.model_copy(update={"offload": "none"})}
    )
    assert not awake.plan.engines_share_devices
    assert config.model_copy().plan == config.plan


def test_the_check_sees_each_way_of_deriving_one():
    source = (
        "a = config.trainer.offload\n"
        "b = config.team.agents[i].workers or config.trainer.workers_per_agent\n"
        "c = config.rollout.max_staleness > 0\n"
        "d = agent.offload\n"
        "e = spec.workers + sandbox.workers + config.plan.agents[i].workers\n"  # not raw: allowed
        "f = self.max_staleness > 0\n"  # a rollout queue's own K: allowed
        "g = config.trainer.share_lora_learners\n"
        "h = self.rollout.weight_sync\n"
        "i = runtime.weight_sync.push(0)\n"  # the runtime's sync: allowed
    )
    assert sorted(raw_reads(source)) == [
        "agent.offload",
        "config.rollout.max_staleness > 0",
        "config.team.agents[i].workers",
        "config.trainer.offload",
        "config.trainer.share_lora_learners",
        "config.trainer.workers_per_agent",
        "self.rollout.weight_sync",
    ]
    assert defined_facts("def overlapped(self): ...\ndef other(): ...") == {"overlapped"}
    assert reads_the_plan("x = config.plan.overlapped") and not reads_the_plan("x = 1")
