"""satseq/algo stays pure: it imports torch, numpy and the standard library only (DESIGN §2)."""

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


def test_checker_sees_forbidden_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import ray.util\nfrom satseq.cluster import x\nfrom numpy import ones\n")
    assert _imported_roots(bad) == {"ray", "satseq.cluster", "numpy"}
