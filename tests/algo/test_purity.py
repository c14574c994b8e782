"""satseq/algo stays pure: it imports torch, numpy and the standard library only (design §2), and
of torch it uses the math: no device memory management (pinned buffers), no sharded tensors and
no process groups, which belong to the learner (`satseq.actors`)."""

import ast
import sys
from pathlib import Path

import satseq.algo

ALGO_DIR = Path(satseq.algo.__file__).parent
ALLOWED_THIRD_PARTY = {"torch", "numpy"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            module = node.module
            roots.add(module if module.startswith("satseq") else module.split(".")[0])
    return roots


def test_algo_imports_only_torch_numpy_stdlib_and_itself():
    offenders = {}
    for path in sorted(ALGO_DIR.glob("*.py")):
        for root in _imported_roots(path):
            in_algo = root.startswith("satseq.algo")
            if not (in_algo or root in ALLOWED_THIRD_PARTY or root in sys.stdlib_module_names):
                offenders.setdefault(path.name, []).append(root)
    assert offenders == {}, f"algo/ must stay pure (torch, numpy, stdlib): {offenders}"


SYSTEMS_NAMES = ("pin_memory", "DTensor", "torch.distributed")


def _systems_names(path: Path) -> set[str]:
    """The forbidden torch systems names a file uses: as attributes, names or imported modules."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute | ast.Name | ast.keyword):
            name = getattr(node, "attr", None) or getattr(node, "id", None) or node.arg
            found |= {forbidden for forbidden in SYSTEMS_NAMES if name == forbidden}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("torch.distributed"):
                found.add("torch.distributed")
            found |= {alias.name for alias in node.names if alias.name in SYSTEMS_NAMES}
        elif isinstance(node, ast.Import) and any(
            alias.name.startswith("torch.distributed") for alias in node.names
        ):
            found.add("torch.distributed")
    return found


def test_algo_manages_no_device_memory_shards_or_process_groups():
    offenders = {
        path.name: sorted(names)
        for path in sorted(ALGO_DIR.glob("*.py"))
        if (names := _systems_names(path))
    }
    assert offenders == {}, f"algo/ is the math; move these to satseq/actors: {offenders}"


def test_checker_sees_systems_names(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from torch.distributed.tensor import DTensor\nx = torch.empty(3, pin_memory=True)\n"
    )
    assert _systems_names(bad) == {"torch.distributed", "DTensor", "pin_memory"}


def test_checker_sees_forbidden_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ray.util\nfrom satseq.cluster import x\nfrom numpy import ones\n")
    assert _imported_roots(bad) == {"ray", "satseq.cluster", "numpy"}
