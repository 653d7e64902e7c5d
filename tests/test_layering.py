"""The layer rule, checked by a tool: engine imports no Qt and no app; kernels import no engine or app."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {"engine": ("PySide6", "PyQt5", "PyQt6", "pyqtgraph", "app"), "kernels": ("engine", "app", "PySide6")}


def imported_modules(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_packages_respect_the_layer_rule():
    violations = []
    for package, forbidden in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for module in imported_modules(path):
                if module.split(".")[0] in forbidden:
                    violations.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not violations


def test_scanner_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from PySide6 import QtWidgets\n")
    assert "PySide6" in list(imported_modules(bad))


def test_app_reaches_the_engine_through_its_public_api_and_the_setup_facade():
    """The app imports `engine` (load, GenerationParams, ...) and `engine.setup` (hub, plan, repack, demo), nothing
    deeper; every name the facade offers resolves."""
    import engine.setup
    reached = [f"{path.relative_to(ROOT)} imports {module}" for path in (ROOT / "app").rglob("*.py")
               for module in imported_modules(path)
               if module.split(".")[0] == "engine" and module not in ("engine", "engine.setup")]
    assert not reached
    for name in engine.setup.__all__:
        assert getattr(engine.setup, name) is not None, name
