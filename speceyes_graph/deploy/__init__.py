"""Server configs that work from an install: ``speceyes serve-config DIR`` writes them.

The repository's ``langgraph.json`` names ``./speceyes_graph/serve.py``, a path only a clone
has. The shipped ``langgraph.json`` names the graphs by module (``speceyes_graph.serve:graph``),
which ``langgraph dev``, ``langgraph build`` and LangGraph Platform import from wherever the
package is installed; Aegra loads graphs by file path only, so its config is written with
the path of the installed ``serve.py``. Either way the graphs are factories that build the
models once per process, on first use (``speceyes_graph/serve.py``); both configs name the
image route too (:mod:`speceyes_graph.deploy.routes`).
"""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path
from typing import Any, cast

__all__ = ["aegra_config", "langgraph_config", "write_server_configs"]


def langgraph_config() -> dict[str, Any]:
    """The shipped ``langgraph.json`` (graphs by module path, with their descriptions)."""
    # json.loads returns Any; the shipped langgraph.json is a JSON object
    return cast(
        dict[str, Any],
        json.loads(resources.files(__name__).joinpath("langgraph.json").read_text()),
    )


def aegra_config() -> dict[str, Any]:
    """An ``aegra.json``: the same graphs, routes and auth, by the file paths of this
    install's ``serve.py``, ``deploy/routes.py`` and ``deploy/auth.py``."""
    serve_py, routes_py = _module_file("speceyes_graph.serve"), _module_file(__name__ + ".routes")
    auth_py = _module_file(__name__ + ".auth")
    graphs = {
        graph_id: f"{serve_py}:{spec['path'].rsplit(':', 1)[1]}"
        for graph_id, spec in langgraph_config()["graphs"].items()
    }
    return {
        "graphs": graphs,
        "http": {"app": f"{routes_py}:app"},
        "auth": {"path": f"{auth_py}:auth"},
    }


def _module_file(module: str) -> Path:
    """Where a module of this package is, located without importing it."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None  # a module of this package
    return Path(spec.origin).resolve()


def write_server_configs(folder: str | Path, *, overwrite: bool = False) -> list[Path]:
    """Write ``langgraph.json`` and ``aegra.json`` into ``folder`` (made if missing); an
    existing file is kept unless ``overwrite``. Returns the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    configs = {folder / "langgraph.json": langgraph_config(), folder / "aegra.json": aegra_config()}
    existing = [str(path) for path in configs if path.exists()]
    if existing and not overwrite:  # checked before writing either: no half-written folder
        raise FileExistsError(
            f"already exists: {', '.join(existing)}; pass overwrite=True (--force)"
        )
    for path, config in configs.items():
        path.write_text(json.dumps(config, indent=2) + "\n")
    return list(configs)
