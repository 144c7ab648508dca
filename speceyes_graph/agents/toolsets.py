"""Declarative toolsets: swap the agent's tools without code.

A toolset is a named list of tools, each given by a registered name or a ``module:attr``
import path, with per-tool settings. Load one from TOML or YAML::

    name = "my-tools"

    [[tools]]
    name = "zoom"
    min_output_side = 336
    coordinates = "thousand"

    [[tools]]
    name = "my_package.tools:word_count"   # a BaseTool, a function, or a factory

Everything is checked when the graph is built: unknown names, settings a tool does not
take, bad values and a missing Tesseract binary raise :class:`ToolsetError` then, not in
the middle of a benchmark run.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, tool

from speceyes_tools.images import ImageStore, ResizeSpec
from speceyes_tools.python_tool import make_python_sandbox_tool
from speceyes_tools.sandbox import SandboxUnavailable
from speceyes_tools.tesseract import OCRUnavailable, make_ocr_tool
from speceyes_tools.vision import make_crop_tool, make_image_zoom_in_tool, make_zoom_tool

__all__ = [
    "BUILTIN_TOOLSETS",
    "ToolSpec",
    "Toolset",
    "ToolsetError",
    "build_tools",
    "load_toolset",
    "register_tool",
]


class ToolsetError(ValueError):
    """A toolset that cannot be built; raised at graph build time."""


_REGISTRY: dict[str, Callable[..., BaseTool]] = {
    "crop": make_crop_tool,
    "zoom": make_zoom_tool,
    "image_zoom_in_tool": make_image_zoom_in_tool,
    "ocr": make_ocr_tool,
    "python_sandbox": make_python_sandbox_tool,
}


def register_tool(name: str, factory: Callable[..., BaseTool]) -> None:
    """Make ``name`` usable in toolset files; ``factory(**settings)`` returns the tool."""
    _REGISTRY[name] = factory


@dataclass(frozen=True)
class ToolSpec:
    name: str  # a registered name or "module:attr"
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Toolset:
    name: str
    tools: tuple[ToolSpec, ...]


BUILTIN_TOOLSETS: dict[str, Toolset] = {
    "deepeyes": Toolset("deepeyes", (ToolSpec("image_zoom_in_tool"),)),
    "vision": Toolset("vision", (ToolSpec("crop"), ToolSpec("zoom"), ToolSpec("ocr"))),
    "thyme": Toolset("thyme", (ToolSpec("python_sandbox"),)),
    "none": Toolset("none", ()),
}


def load_toolset(source: str | Path | Toolset | Mapping[str, Any] | None) -> Toolset:
    """A built-in name, a ``.toml``/``.yaml`` path, a mapping in the file's shape, or a Toolset."""
    if source is None:
        return BUILTIN_TOOLSETS["none"]
    if isinstance(source, Toolset):
        return source
    if isinstance(source, Mapping):
        return _from_mapping(source, "<mapping>")
    if isinstance(source, str) and source in BUILTIN_TOOLSETS:
        return BUILTIN_TOOLSETS[source]
    path = Path(source)
    if not path.exists():
        raise ToolsetError(
            f"unknown toolset {str(source)!r}: not a built-in ({', '.join(BUILTIN_TOOLSETS)}) "
            "and no such file"
        )
    text = path.read_text()
    if path.suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Python 3.10
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ToolsetError(f"{path}: invalid TOML: {exc}") from exc
    elif path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise ToolsetError("YAML toolsets need PyYAML: pip install pyyaml") from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ToolsetError(f"{path}: invalid YAML: {exc}") from exc
    else:
        raise ToolsetError(f"{path}: toolset files must be .toml, .yaml or .yml")
    return _from_mapping(data, str(path))


def _from_mapping(data: Mapping[str, Any], where: str) -> Toolset:
    entries = data.get("tools")
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        raise ToolsetError(f"{where}: expected a list under 'tools'")
    specs = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise ToolsetError(
                f"{where}: tools[{i}] needs a 'name' (a registered tool or module:attr)"
            )
        settings = {k: v for k, v in entry.items() if k not in ("name", "settings")}
        settings.update(entry.get("settings") or {})
        specs.append(ToolSpec(entry["name"], settings))
    return Toolset(str(data.get("name", Path(where).stem)), tuple(specs))


def _resolve(name: str) -> Any:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" not in name:
        raise ToolsetError(
            f"unknown tool {name!r}; registered tools: {', '.join(sorted(_REGISTRY))} "
            "(or give an import path 'module:attr')"
        )
    module_name, _, attr = name.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ToolsetError(f"cannot import tool {name!r}: {exc}") from exc
    return obj


def build_tools(
    toolset: Toolset, *, resize: ResizeSpec | None = None, store: ImageStore | None = None
) -> list[BaseTool]:
    """Instantiate every tool of a toolset, failing early and clearly."""
    tools: list[BaseTool] = []
    for spec in toolset.tools:
        target = _resolve(spec.name)
        settings = dict(spec.settings)
        if isinstance(settings.get("resize"), Mapping):
            settings["resize"] = ResizeSpec(**settings["resize"])
        try:
            if isinstance(target, BaseTool):
                if settings:
                    raise ToolsetError(
                        f"tool {spec.name!r} is a ready-made tool and takes no settings: {sorted(settings)}"
                    )
                built = target
            elif callable(target):
                params = inspect.signature(target).parameters
                takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
                if spec.name in _REGISTRY or _is_factory(target):
                    for key, value in (("resize", resize), ("store", store)):
                        if (
                            value is not None
                            and key not in settings
                            and (key in params or takes_kwargs)
                        ):
                            settings[key] = value
                    unknown = [k for k in settings if k not in params and not takes_kwargs]
                    if unknown:
                        allowed = [p for p in params if p not in ("store",)]
                        raise ToolsetError(
                            f"tool {spec.name!r} does not take {unknown}; it takes {allowed}"
                        )
                    built = target(**settings)
                else:  # a plain function becomes a tool
                    if settings:
                        raise ToolsetError(
                            f"tool {spec.name!r} is a function and takes no settings: {sorted(settings)}"
                        )
                    built = tool(target)
            else:
                raise ToolsetError(f"{spec.name!r} is neither a tool nor a tool factory")
        except ToolsetError:
            raise
        except (OCRUnavailable, SandboxUnavailable) as exc:
            raise ToolsetError(f"tool {spec.name!r}: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise ToolsetError(
                f"tool {spec.name!r}: bad settings {dict(spec.settings)}: {exc}"
            ) from exc
        if not isinstance(built, BaseTool):
            raise ToolsetError(
                f"tool {spec.name!r} did not produce a LangChain tool (got {type(built).__name__})"
            )
        tools.append(built)
    names = [t.name for t in tools]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ToolsetError(f"toolset {toolset.name!r} names a tool twice: {sorted(duplicates)}")
    return tools


def _is_factory(obj: Any) -> bool:
    """A callable whose return annotation says it builds a tool."""
    try:
        ret = inspect.signature(obj).return_annotation
    except (TypeError, ValueError):
        return False
    return (
        ret is BaseTool
        or (isinstance(ret, type) and issubclass(ret, BaseTool))
        or ret in ("BaseTool",)
    )
