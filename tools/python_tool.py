"""``python_sandbox``: the code tool of Thyme-style agents, as a LangChain tool.

The model writes Python; the tool runs it in the OS sandbox (:mod:`.sandbox`) with the
query's first image readable at ``/mnt/data/images/<name>`` (its original pixels and size:
Thyme computes boxes in original coordinates, and the harness clamps literal crop boxes to
them), and returns what the code produced: the images it wrote to
``/mnt/data/temp_processed_images`` (moved into the image store, referenced by ``blob://``
keys), else its printed text, else the error. The artifact keeps the whole trace: the code
as executed, stdout, stderr, images, latency, sandbox overhead and error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, Field

from .blobs import is_blob_key
from .images import ImageStore, default_store, encode_png, exif_orientation, sniff_mime
from .sandbox import INPUT_DIR, Sandbox, SandboxLimits, SandboxUnavailable, default_sandbox

__all__ = ["make_python_sandbox_tool", "sandbox_image"]

_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/webp": ".webp",
    "image/gif": ".gif",
}


def _stem_and_extension(ref: str, store: ImageStore) -> tuple[str, str | None]:
    """The name the image gets in the sandbox (a file keeps its own stem) and the extension
    of its format, from its header only; None for images sent as PNG: other formats, and
    photos with an EXIF orientation (PIL in the sandbox would open them sideways, while the
    prompt gives the upright size the model saw)."""
    key = store.intern(ref)  # query images are already stable: a path or a blob key
    if is_blob_key(key):
        data = store.read(key)
        stem, head, orientation = "image", data[:16], exif_orientation(data)
    else:
        with open(key, "rb") as f:
            stem, head = Path(key).stem or "image", f.read(16)
            f.seek(0)
            orientation = exif_orientation(f)
    return stem, None if orientation != 1 else _EXTENSIONS.get(sniff_mime(head))


def sandbox_image(ref: str, store: ImageStore | None = None) -> tuple[bytes, str, tuple[int, int]]:
    """(encoded bytes, file name, (width, height)) of a query image as the sandbox gets it:
    the original bytes (no re-encoding) and, for a file, its own name, as the published
    harness shows the dataset's path; formats other than PNG, JPEG, WebP and GIF, and
    rotated photos, become an upright PNG."""
    store = store or default_store()
    stem, ext = _stem_and_extension(ref, store)
    size = store.size(ref)
    if ext is None:
        return encode_png(store.get(ref)), stem + ".png", size
    return store.encoded(ref), stem + ext, size


def sandbox_image_path(ref: str, store: ImageStore | None = None) -> tuple[str, tuple[int, int]]:
    """Where the code finds the query image in the sandbox, and its original size (for the
    prompt: reads the first bytes only)."""
    store = store or default_store()
    stem, ext = _stem_and_extension(ref, store)
    return f"{INPUT_DIR}/{stem}{ext or '.png'}", store.size(ref)


class _CodeArgs(BaseModel):
    code: str = Field(description="Python code to run on the query's image (PIL, NumPy, OpenCV).")
    state: Annotated[dict, InjectedState]


def make_python_sandbox_tool(
    sandbox: Sandbox | None = None,
    store: ImageStore | None = None,
    wall_s: float | None = None,
) -> BaseTool:
    """The ``python_sandbox`` tool. ``sandbox`` defaults to one shared :class:`Sandbox`
    (checked now, so a host without bubblewrap fails when the graph is built);
    ``wall_s`` overrides the per-run limit (published: 10 s)."""
    if sandbox is None:
        sandbox = Sandbox(SandboxLimits(wall_s=wall_s)) if wall_s else default_sandbox()
    sandbox.check()  # raises SandboxUnavailable with bubblewrap's own message
    store_ = store

    def run(code: str, state: dict) -> tuple[Any, dict]:
        t0 = time.perf_counter()
        store = store_ or default_store()
        images = (state or {}).get("images") or []
        if isinstance(images, str):
            images = [images]
        data, name, size = sandbox_image(images[0], store) if images else (None, "image.png", None)
        try:
            result = sandbox.run(code, data, image_name=name, image_size=size)
        except SandboxUnavailable as exc:
            raise ToolException(f"Error: the code sandbox is unavailable: {exc}") from None
        keys = [store.put_array(image.pixels) for image in result.images]
        if keys:
            content: Any = [{"type": "image", "url": k, "mime_type": "image/png"} for k in keys]
        elif result.error:
            detail = result.stderr.strip() or result.stdout.strip()
            content = f"Error: {result.error}" + (f"\n{detail[-2000:]}" if detail else "")
        else:
            content = result.stdout.strip() or "(the code printed nothing and wrote no image)"
        artifact = {
            "tool": "python_sandbox",
            "code": result.code or code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "images": keys,
            "error": result.error,
            "notes": result.notes,
            "timed_out": result.timed_out,
            "overhead_s": result.overhead_s,
            "latency_s": time.perf_counter() - t0,
        }
        return content, artifact

    return StructuredTool.from_function(
        func=run,
        name="python_sandbox",
        description=(
            "Run Python code on the query's image in a sandbox. The image is at `image_path`; "
            "save processed images under /mnt/data/temp_processed_images/ and print their paths, "
            "or print a computed result."
        ),
        args_schema=_CodeArgs,
        response_format="content_and_artifact",
    )
