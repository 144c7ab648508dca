"""The package's map holds (issue 57): layers import downwards only, a short top level,
no dependency's private module imported outside ``_compat``, and no function grows past what
one reading takes."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import speceyes_graph

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "speceyes_graph"
SUBPACKAGES = ("gate", "agents", "graph", "integrations")


def test_each_layer_imports_only_the_layers_below_it() -> None:
    # import-linter reads the contract in pyproject.toml (and breaks on an import that runs
    # back up, e.g. the gate importing the graph)
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout


def test_no_modules_import_each_other_in_a_circle() -> None:
    """No cycles, type-only imports included (grimp, the graph import-linter reads)."""
    import grimp

    graph = grimp.build_graph("speceyes_graph", cache_dir=None)
    circles = [
        (a, b)
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if graph.chain_exists(importer=b, imported=a)
    ]
    assert not circles, circles


def test_the_top_level_is_short_and_each_part_says_what_it_holds() -> None:
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(modules) <= 12, modules
    for name in SUBPACKAGES:
        doc = importlib.import_module(f"speceyes_graph.{name}").__doc__ or ""
        assert "May import" in doc, name


# the module paths before the subpackages (issue 57); the package was never released under
# them, so they are gone rather than aliased (issue 68)
OLD_PATHS = ("online_gate", "middleware", "agent", "separability", "calibration", "options")


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_module_paths_are_gone(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"speceyes_graph.{old}")


def _imported_modules(path: Path) -> list[str]:
    """The absolute module names a file imports (``from x import y`` and ``import x``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_no_private_module_of_a_dependency_is_imported_outside_compat() -> None:
    """``speceyes_graph/_compat.py`` is the one place that may reach into a dependency's
    internals (each use there is tested at both ends of the declared range)."""
    ours = ("speceyes_graph", "speceyes_tools")
    private = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "tools").glob("*.py")):
        if path == PACKAGE / "_compat.py":
            continue
        for name in _imported_modules(path):
            parts = name.split(".")
            if parts[0] not in ours and any(p.startswith("_") for p in parts[1:]):
                private.append(f"{path.relative_to(ROOT)}: {name}")
    assert not private, private
    # the check can see one: _compat's own imports are private ones
    assert any("._" in n for n in _imported_modules(PACKAGE / "_compat.py"))


def test_the_public_names_import_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in speceyes_graph.__all__:
            assert getattr(speceyes_graph, name) is not None


def test_no_function_is_longer_than_one_reading() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "tools").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 150:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert not long, long
