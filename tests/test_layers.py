"""Data flows one way (docs/architecture.md, "Layers and the one-direction rule").

Each subpackage of ``robustbench_fm`` is a layer with a rank; a module may import its own layer
and the layers ranked below it, never above, at module top or inside a function:

    core  <  data, encoders  <  features  <  paper  <  methods  <  report  <  pipeline  <  api  <  cli

``data`` and ``encoders`` are siblings (neither imports the other). Hydra (``hydra``) is the command
line's: only ``cli`` imports it, except that ``pipeline`` reads the experiments' config files through
Hydra's compose API (:data:`COMPOSE_API`: composing a config and expanding a sweep's job list, as
the command line without ``-m`` and ``robustbench_fm.run`` do, with the generated options it stores
in Hydra's ConfigStore and the resolvers, one of which reads a job's ``HydraConfig`` when one is set);
never ``hydra.main``, callbacks or launchers. Methods may import one another but not the reports' collector
or the command line. The import graph between modules (imports inside functions included) has no
cycle. No module is exempt.

``paper`` is a leaf both the methods and the reports read: ``paper.published`` (the papers'
published values and model labels, package data) and ``paper.figures`` (what every paper's figures
share: the columns a figure needs, a figure written as PNG and PDF); of ours it imports ``core``
only (:data:`LEAVES`)."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "robustbench_fm"
RANK = {"core": 0, "data": 1, "encoders": 1, "features": 2, "paper": 3, "methods": 4, "report": 5, "pipeline": 6,
        "api": 7, "cli": 8}
#: layers that import nothing of ours but ``core``, whatever their rank
LEAVES = ("paper",)
#: the Hydra modules ``pipeline`` may import: composing configs and the basic sweeper's job list
COMPOSE_API = {"hydra", "hydra.compose", "hydra.initialize_config_dir", "hydra.core.global_hydra",
               "hydra.core.override_parser.overrides_parser", "hydra._internal.core_plugins.basic_sweeper",
               "hydra._internal.config_repository",  # the sweep's file cache (pipeline/experiment._FilesReadOnce)
               "hydra.core.config_store",  # the generated encoder= / stage= options (pipeline/configstore.register)
               "hydra.core.hydra_config"}  # read by ${launch_dir:} inside a job (pipeline/resolvers.launch_dir)
LAYERS = sorted(RANK, key=RANK.get)


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, top_only: bool = False) -> list[str]:
    """Every module of ours ``path`` imports (absolute names; ``from x import y`` counts
    ``x.y`` where ``y`` is a module). ``top_only``: statements at module level only."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts[:-1]  # a module's package; for an __init__, the package itself
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_only else ast.walk(tree)
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
            # ``from pkg import mod`` needs ``pkg.mod``; ``pkg`` itself is already being imported
            out += submodules if len(submodules) == len(node.names) else [module, *submodules]
    return [n for n in out if n == "robustbench_fm" or n.startswith(("robustbench_fm.", "hydra"))]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_upward(layer):
    bad = []
    for module, path in MODULES.items():
        if _layer(module) != layer:
            continue
        for name in _imports(path):
            if name.startswith("hydra"):
                if layer != "cli" and not (layer == "pipeline" and name in COMPOSE_API):
                    bad.append(f"{module} imports {name} (Hydra is the command line's)")
                continue
            target = _layer(name)
            if target is not None and RANK[target] > RANK[layer]:
                bad.append(f"{module} imports {name} ({target} is above {layer})")
            if layer == "data" and target == "encoders" or layer == "encoders" and target == "data":
                bad.append(f"{module} imports {name} (data and encoders are siblings)")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    """The imports between files form no cycle, imports inside functions included (a lazy import
    defers loading; it does not make two files that need each other one direction)."""
    graph = {m: {n for n in _imports(p) if n in MODULES and n != m} for m, p in MODULES.items()}
    # a package's __init__ importing its own submodules is not a cycle with those submodules
    cycles = []
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                if not all(b.startswith(a + ".") or a.startswith(b + ".") for a, b in zip(cycle, cycle[1:])):
                    cycles.append(" -> ".join(cycle))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


def test_the_feature_store_calls_the_engine_and_the_embedder_calls_the_store():
    """features/ in one direction (issue 43): the engine's row module does not import its panel
    module; the store imports no engine module (the engine is the backend it is handed); the
    Embedder touches no private name of another object (``store._hash``, ``chunk._cache = None``)."""
    feats = "robustbench_fm.features"
    assert f"{feats}.engine.panel" not in _imports(MODULES[f"{feats}.engine.rows"])
    assert not [n for n in _imports(MODULES[f"{feats}.store"]) if n.startswith(f"{feats}.engine")]
    tree = ast.parse(MODULES[f"{feats}.embed"].read_text())
    private = [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
               and not (isinstance(n.value, ast.Name) and n.value.id == "self")]
    assert not private, "\n".join(private)


def test_the_leaf_layers_import_nothing_above_core():
    """A leaf layer (:data:`LEAVES`: ``paper``, read by the methods and the reports) imports of ours
    ``core`` only, at module top or inside a function, so reading it pulls no other layer in."""
    for layer in LEAVES:
        modules = [m for m in MODULES if _layer(m) == layer]
        assert {f"robustbench_fm.{layer}.published", f"robustbench_fm.{layer}.figures"} <= set(modules)
        for name in modules:
            above = [n for n in _imports(MODULES[name]) if n.startswith("robustbench_fm") and _layer(n) not in
                     ("core", layer)]
            assert above == [], f"{name} imports {', '.join(above)}"


def test_no_module_of_a_higher_layer_is_exempt():
    """The rule has no whitelist: no module of ``methods`` reads one of ``report`` (the papers'
    published values and the figures' helpers live in ``paper``, below both)."""
    readers = [f"{m} imports {n}" for m, p in MODULES.items() if _layer(m) == "methods"
               for n in _imports(p) if _layer(n) == "report"]
    assert readers == [], "\n".join(readers)


def test_the_methods_draw_their_figures_with_the_shared_helpers():
    """Every ``plots`` module of a method and the reports' heat maps (``report.comparisons``) save
    their figures through ``paper.figures``; no method imports another method's plots for them."""
    users = [m for m in MODULES if m.startswith("robustbench_fm.methods.") and m.endswith(".plots")]
    assert len(users) >= 3
    for module in [*users, "robustbench_fm.report.comparisons"]:
        names = _imports(MODULES[module])
        assert "robustbench_fm.paper.figures" in names, module
        assert not [n for n in names if n.endswith(".plots")], module


def test_the_check_resolves_relative_imports():
    """The scan itself: relative imports resolve to absolute module names."""
    names = _imports(PACKAGE / "data" / "ct" / "__init__.py")
    assert "robustbench_fm.data.registry" in names and "robustbench_fm.data.ct.layouts" in names


def test_every_module_is_in_a_layer():
    """Only ``__init__``, ``__main__`` and ``api`` sit at the package root."""
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert root == ["__init__", "__main__", "api"]


def test_imports_inside_functions_say_why():
    """Imports of our modules sit at module top; one inside a function is lazy on purpose (its
    target imports torch or matplotlib, or it would close a cycle) and says so in a comment on its
    line or the line above."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                ours = isinstance(node, ast.ImportFrom) and (node.level or str(node.module).startswith(PACKAGE.name))
                if ours:
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "#" not in here and not above.startswith("#"):
                        silent.append(f"{module}:{node.lineno}: {here.strip()}")
    assert not silent, "\n".join(sorted(set(silent)))
