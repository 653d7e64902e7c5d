"""The layer rules, checked by static import parsing (ast: no module is imported, so this runs in a second).

Every import counts, at module level or inside a function: a lazy import hides a dependency from the
reader, not from the design. The layers, lowest first; a module may import its own layer and those below:

    0  kernels            Triton kernels beside their torch references, the quant format descriptors
    1  engine base        errors, sizes, options, params, host, detokenize: plain facts and types
    2  engine.model       what a model computes: specs, family descriptors, layers, per-family pieces
    3  engine.format      on disk: quant, block layout, checkpoints, sluice.json, repack, resolve
    4  engine.runtime     how it runs: store -> cache -> slots -> kernels, budgets, telemetry
    5  engine.plan, hub   before running: hardware probe, fit and speed estimate; hub search and download
    6  engine.engine, engine (its __init__)   the public API
    7  engine.serve, engine.tools, engine.setup   the edges built on the public API
The model sits below the format because a checkpoint's layout is the family's (tensor names, expert
blocks), while a model computes from whatever weights it is given. Besides: kernels import no engine,
the engine imports no Qt and no app, and no module takes part in an import cycle.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"engine": ("PySide6", "PyQt5", "PyQt6", "pyqtgraph", "app"), "kernels": ("engine", "app", "PySide6")}
BASE = ("engine.errors", "engine.sizes", "engine.options", "engine.params", "engine.host", "engine.detokenize")
LAYERS = [("kernels",), BASE, ("engine.model",), ("engine.format",), ("engine.runtime",),
          ("engine.plan", "engine.hub"), ("engine.engine", "engine"), ("engine.serve", "engine.tools", "engine.setup")]
# Imports that break the order today, each to be deleted by its owner's change (a stale entry fails the test).
KNOWN_ORDER_VIOLATIONS: set[str] = set()
KNOWN_CYCLES: set[tuple[str, ...]] = set()
# The app's rule (it reaches the engine only through its public API and the engine.setup facade) goes here.


def imported_modules(path: Path, module: str = ""):
    """Every module `path` imports, as written (relative imports resolved against `module`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
            yield f"{base}.{node.module}" if node.module else base
            yield from (f"{base}.{node.module or ''}.{alias.name}".replace("..", ".") for alias in node.names)


def _modules() -> dict[str, Path]:
    found = {}
    for package in ("engine", "kernels"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a `from package import name` names the submodule if any)."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_modules(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def layer_of(module: str) -> int:
    """Index in LAYERS of the most specific prefix that holds `module`."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.add(tuple(sorted(component)))
    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_packages_respect_the_layer_rule():
    violations = []
    for package, forbidden in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for module in imported_modules(path):
                if module.split(".")[0] in forbidden:
                    violations.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not violations


def test_no_module_imports_a_higher_layer():
    upward = {f"{module} -> {target}" for module, targets in import_graph().items() for target in targets
              if layer_of(target) > layer_of(module)}
    assert upward - KNOWN_ORDER_VIOLATIONS == set(), "imports against the layer order"
    assert KNOWN_ORDER_VIOLATIONS - upward == set(), "fixed: delete these from KNOWN_ORDER_VIOLATIONS"


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found - KNOWN_CYCLES == set(), "new import cycles"
    assert KNOWN_CYCLES - found == set(), "fixed: delete these from KNOWN_CYCLES"


def test_cycle_finder_and_layers_see_a_violation():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}
    assert layer_of("engine.format.quant") > layer_of("engine.model.spec") > layer_of("kernels.formats")
    assert layer_of("engine.errors") == 1 and layer_of("engine.engine") == layer_of("engine") == 6


def test_scanner_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from PySide6 import QtWidgets\n")
    assert "PySide6" in list(imported_modules(bad))


def test_app_reaches_the_engine_through_its_public_api_and_the_setup_facade():
    """The app imports `engine` (load, GenerationParams, ...) and `engine.setup` (hub, plan, repack, demo), nothing
    deeper; every name the facade offers resolves."""
    import engine.setup
    modules = _modules()

    def module_of(name: str) -> str:        # `from engine import SluiceError` names the module `engine`
        while name not in modules:
            name = name.rpartition(".")[0]
        return name
    reached = [f"{path.relative_to(ROOT)} imports {name}" for path in (ROOT / "app").rglob("*.py")
               for name in imported_modules(path)
               if name.split(".")[0] == "engine" and module_of(name) not in ("engine", "engine.setup")]
    assert not reached
    for name in engine.setup.__all__:
        assert getattr(engine.setup, name) is not None, name
