"""Data flows one way: the lower layers (the base modules at the package root, ``data``,
``encoders``, ``features``) never import the methods (``spar``, ``stages``, ``heads``, the
method modules at the root), the reports or the command line, at module top or inside a
function (docs/architecture.md, "Layers")."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "robustbench_fm"
LOWER = ("data", "encoders", "features")
BASE = ("errors", "registry", "atomic", "locks", "devices", "redact", "results", "manifest", "neighbors", "stats",
        "resolvers", "outputs")
UPPER = ("spar", "stages", "heads", "report", "app", "sweeps", "__main__", "api", "doctor", "candor_tasks",
         "candor_sets", "rank_stats", "impurity", "croma_panel", "shortcut_metrics")


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, as an absolute ``robustbench_fm....`` name where it is ours."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1]  # a module's package; for an __init__, the package itself
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [module] + ([f"{module}.{a.name}" for a in node.names] if not node.module or node.level else [])
    return out


@pytest.mark.parametrize("layer", [*LOWER, "base"])
def test_lower_layers_never_import_upward(layer):
    bad = []
    paths = [PACKAGE / f"{m}.py" for m in BASE] if layer == "base" else sorted((PACKAGE / layer).rglob("*.py"))
    for path in paths:
        for name in _imports(path):
            top = name.split(".")
            if top[0] == "robustbench_fm" and len(top) > 1 and top[1] in UPPER:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not bad, "\n".join(bad)


def test_the_check_resolves_relative_imports():
    """The scan itself: relative imports resolve to absolute module names."""
    probe = PACKAGE / "data" / "ct" / "__init__.py"
    names = _imports(probe)
    assert "robustbench_fm.data.registry" in names and "robustbench_fm.data.ct.layouts" in names
