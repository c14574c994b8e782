"""The house stays in rooms a newcomer can find: no module past 450 lines, no class past 20
methods, no function past 70 lines, a recipe's `run_stage` included (it reads as the paper's
stage top to bottom, each step's detail in a method of its own; STYLE: a file past ~400 lines
is a sign to split)."""

import ast
import inspect
from pathlib import Path

import satseq

ROOT = Path(satseq.__file__).parent
MAX_MODULE_LINES = 450
MAX_CLASS_METHODS = 20
MAX_FUNCTION_LINES = 70


def shape_violations(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text()
    where = path.relative_to(root.parent)
    found = []
    if source.count("\n") > MAX_MODULE_LINES:
        found.append(f"{where}: {source.count(chr(10))} lines")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = [
                n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            if len(methods) > MAX_CLASS_METHODS:
                found.append(f"{where}: class {node.name} has {len(methods)} methods")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno}: {node.name} is {length} lines")
    return found


def test_modules_classes_and_functions_stay_small():
    violations = [v for path in sorted(ROOT.rglob("*.py")) for v in shape_violations(path)]
    assert violations == []


def test_the_check_sees_a_long_function_and_a_large_class(tmp_path):
    body = "".join(f"    def m{i}(self):\n        pass\n" for i in range(21))
    lines = "".join(f"    x{i} = {i}\n" for i in range(71))
    source = tmp_path / "satseq_shape.py"
    source.write_text(f"class Big:\n{body}\n\ndef long():\n{lines}")
    assert len(shape_violations(source, root=tmp_path)) == 2


def test_the_team_runtime_is_given_a_started_team_not_its_parts():
    from satseq.cluster.runtime import TeamRuntime

    parameters = list(inspect.signature(TeamRuntime.__init__).parameters)[1:]  # after self
    assert len(parameters) <= 6, parameters
