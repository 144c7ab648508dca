"""A Griffe extension for the API reference: Sphinx roles in docstrings become links.

The docstrings cross-reference with Sphinx roles (``:class:`OnlineGate```, ``:func:`~a.b.f```,
``:mod:`.served```, ``:meth:`put <speceyes_tools.images.ImageStore.put>```), which IDEs and
``help()`` read well but Markdown prints raw. Each role is resolved as Sphinx would resolve
it (a full path, a name relative to the module with leading dots, or a name in the object's
scope) and replaced by an *optional* autorefs reference: a link where the target is on a
page of the site, the name in code where it is not (a private helper, another library), so
a strict build never fails on a name the reference does not show. ``~`` shows the last part
only, as in Sphinx.

Loaded by ``mkdocs.yml`` (``extensions: [docs/griffe_roles.py]``), from the repository root.
"""

from __future__ import annotations

import functools
import html
import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`"
)
EXPLICIT = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")


def _relative(obj: griffe.Object, target: str) -> str:
    """``.name`` / ``..name`` against the module of ``obj`` (a package counts as its own)."""
    dots = len(target) - len(target.lstrip("."))
    module = obj.module
    package = module.path if module.is_package else module.path.rpartition(".")[0]
    base = package.split(".")
    if dots > 1:
        base = base[: len(base) - (dots - 1)]
    return ".".join([*base, target[dots:]])


def resolve(obj: griffe.Object, target: str) -> str:
    """The full path a role's target names, as seen from ``obj`` (best effort)."""
    target = target.strip().rstrip("()")
    if target.startswith("."):
        return _relative(obj, target)
    head, _, rest = target.partition(".")
    for scope in (obj, obj.parent, obj.module):
        if scope is None:
            continue
        try:
            found = scope.resolve(head)
        except Exception:
            continue
        return f"{found}.{rest}" if rest else found
    return target


def link(obj: griffe.Object, match: re.Match[str]) -> str:
    body = match["body"].strip()
    explicit = EXPLICIT.match(body)
    if explicit:
        title, target = explicit["title"], explicit["target"]
    else:
        short = body.startswith("~")
        target = body.lstrip("~")
        title = target.rstrip("()").rsplit(".", 1)[-1] if short else target.lstrip(".")
    identifier = resolve(obj, target.lstrip("~"))
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(title)}</code></autoref>"
    )


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of the loaded packages (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[griffe.Object | griffe.Alias] = [pkg]
        while stack:
            obj = stack.pop()
            if isinstance(obj, griffe.Alias) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(functools.partial(link, obj), obj.docstring.value)
            stack.extend(obj.members.values())
