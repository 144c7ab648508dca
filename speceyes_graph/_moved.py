"""Old import paths of modules that moved into the subpackages (issue 57).

``import speceyes_graph.online_gate`` still works: it is the module now at
``speceyes_graph.gate.online`` (the same object, so patches and ``isinstance`` agree), with a
:class:`DeprecationWarning` naming the new path. Checkpoints written before the move name
the old paths too; they load through the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

# old module (under speceyes_graph) -> where it lives now
MOVED: dict[str, str] = {
    "separability": "gate.separability",
    "calibration": "gate.calibration",
    "label_free": "gate.label_free",
    "drift": "gate.drift",
    "online_gate": "gate.online",
    "online_steps": "gate.online_steps",
    "ledger": "gate.ledger",
    "gate_keys": "gate.keys",
    "shadowing": "gate.shadowing",
    "agent": "agents.loop",
    "toolsets": "agents.toolsets",
    "options": "graph.options",
    "nodes": "graph.nodes",
    "fallback": "graph.fallback",
    "specreason": "graph.specreason",
    "tool_speculation": "graph.tool_speculation",
    "parallel_drafts": "graph.parallel_drafts",
    "drawing": "graph.drawing",
    "middleware": "integrations.middleware",
    "compose": "integrations.compose",
    "studio": "integrations.studio",
    "store_reading": "integrations.store_reading",
    "draft_reply": "integrations.draft_reply",
    "turns": "integrations.turns",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``speceyes_graph.<old>`` and hands back the module at its new path."""

    def __init__(self, package: str) -> None:
        self.package = package
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # old path -> own spec

    def new_name(self, fullname: str) -> str | None:
        head, _, tail = fullname.partition(".")
        if head != self.package or tail not in MOVED:
            return None
        return f"{self.package}.{MOVED[tail]}"

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.new_name(spec.name)
        assert new is not None  # find_spec answered for it
        # stacklevel 2 names the importing line: the warnings module skips importlib's frames
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path already; importlib has just given it the old
        path's spec, so put its own back (``importlib.reload`` and pickling read it)."""
        assert module.__spec__ is not None  # importlib set the old path's
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install(package: str) -> None:
    """Answer the old paths of ``package`` (once per process)."""
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules(package))
