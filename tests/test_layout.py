"""The package's map holds (issue 57): layers import downwards only, a short top level,
old import paths still work, and no function grows past what one reading takes."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import speceyes_graph
from speceyes_graph._moved import MOVED

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
    modules = sorted(
        p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")
    )
    assert len(modules) <= 12, modules
    for name in SUBPACKAGES:
        doc = importlib.import_module(f"speceyes_graph.{name}").__doc__ or ""
        assert "May import" in doc, name


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_still_imports_with_a_warning(old: str) -> None:
    new = importlib.import_module(f"speceyes_graph.{MOVED[old]}")
    sys.modules.pop(f"speceyes_graph.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"speceyes_graph.{MOVED[old]}"):
        moved = importlib.import_module(f"speceyes_graph.{old}")
    assert moved is new
    assert moved.__spec__.name == new.__name__  # its own spec: reload and pickle find it
    # every public name it had is where it was
    for name in getattr(new, "__all__", []):
        assert getattr(moved, name) is getattr(new, name)


def test_old_from_imports_work_in_a_fresh_interpreter() -> None:
    # what users' code and the docs before the move wrote, run cold (no module cached)
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from speceyes_graph.online_gate import OnlineGate\n"
        "    from speceyes_graph.middleware import SpecEyesMiddleware\n"
        "    from speceyes_graph.agent import create_agent_loop\n"
        "    from speceyes_graph.separability import GateConfig\n"
        "    from speceyes_graph import calibration\n"
        "    from speceyes_graph.graph import create_speceyes_graph\n"
        "print(sorted({str(w.message).split()[0] for w in seen\n"
        "              if issubclass(w.category, DeprecationWarning)\n"
        "              and str(w.message).startswith('speceyes_graph')}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split("\n")[0] == str(
        sorted(
            f"speceyes_graph.{m}"
            for m in ("online_gate", "middleware", "agent", "separability", "calibration")
        )
    )


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
