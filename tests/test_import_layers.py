"""The import layers (design §2): `algo` ← `actors` ← `cluster`, evaluation and serving beside the
trainer, leaf services below, and no import circle between satseq's modules.

Every import statement counts, at any depth of a file (inside functions and TYPE_CHECKING too):
a lazy import is still a dependency.
"""

import ast
import subprocess
import sys
from pathlib import Path

import satseq

ROOT = Path(satseq.__file__).parent

# part → the parts it must never import (a part is satseq's top-level package or module)
FORBIDDEN = {
    "actors": {"cluster", "cli", "launch", "evaluation", "serving"},
    "sandbox": {"actors", "cluster", "cli", "launch", "config"},
    "rewards": {"actors", "cluster", "cli", "launch"},
    "evaluation": {"cluster", "cli"},
    "serving": {"cluster", "cli"},
    "launch": {"cluster", "cli", "evaluation", "serving"},
    "config": {"actors", "cluster", "cli", "launch"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in ROOT.rglob("*.py")}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The satseq modules a file imports: `from a.b import c` is module a.b.c when that is a
    module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [name if name in modules else node.module for name in names]
        else:
            continue
        found |= {name for name in names if name.split(".")[0] == "satseq"}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {
        name: {target for target in imported_modules(path, modules) if target != name}
        for name, path in modules.items()
    }


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, each once, found by depth-first search."""
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_algo_imports_nothing_of_satseq_but_itself():
    offenders = {
        module: sorted(target for target in targets if part(target) != "algo")
        for module, targets in import_graph().items()
        if part(module) == "algo"
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_no_part_imports_a_layer_it_must_not():
    offenders = {
        module: sorted(t for t in targets if part(t) in FORBIDDEN[part(module)])
        for module, targets in import_graph().items()
        if part(module) in FORBIDDEN
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_no_import_circle_between_modules():
    assert circles(import_graph()) == []


def test_recipes_and_the_learner_import_without_ray_or_vllm():
    """A recipe's math and wiring, and a learner, run in a plain process: importing them with
    `ray` and `vllm` unimportable works (Ray is imported where an actor is made of them)."""
    code = (
        "import sys\n"
        "sys.modules['ray'] = sys.modules['vllm'] = None  # any import of them now fails\n"
        "import satseq.actors.learner, satseq.cluster.recipes\n"
        "assert 'ray' not in [m for m, v in sys.modules.items() if v is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_training_driver_imports_without_torch_or_transformers():
    """`satseq train`'s own process only talks to the coordinator: the training stack is
    imported by the actors' processes, not again by the driver (about 9 s of a run's start)."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = sys.modules['transformers'] = None  # their import now fails\n"
        "import satseq.cli.main, satseq.cluster.driver\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_checks_see_a_forbidden_import_and_a_circle(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text("from satseq.cluster.learner_specs import x\nimport satseq.algo.kl\n")
    expected = {"satseq.cluster.learner_specs", "satseq.algo.kl"}
    assert imported_modules(source, all_modules()) == expected
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
