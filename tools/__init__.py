"""speceyes_tools: vision tools (crop, zoom, OCR, a code sandbox) as LangChain tools.

The module-level tools are default instances (boxes in the model's resized frame, Qwen2.5-VL
resize rule). Use the ``make_*`` factories for other settings. The tools read the query's
images from graph state (``state["images"]``, a list of references), so they work in any
LangGraph agent whose state has that key, or directly::

    zoom.invoke({"bbox": [10, 10, 200, 120], "state": {"images": ["photo.jpg"]}})
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .blobs import (
    BlobStore,
    DirectoryBlobs,
    FsspecBlobs,
    MemoryBlobs,
    PostgresBlobs,
    blobs_from_url,
)
from .deadlines import DeadlineExceeded, call_with_deadline, deadline_scope
from .geometry import BoxError, Coordinates, PixelBox, clamp_box, parse_box, to_original
from .images import (
    ImageLoadError,
    ImagePolicy,
    ImagePolicyError,
    ImageStore,
    ResizeSpec,
    default_store,
    encode_image,
    load_image,
    put_bytes,
    release,
    smart_resize,
)
from .python_tool import make_python_sandbox_tool
from .sandbox import Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable
from .tesseract import OCRUnavailable, check_tesseract, make_ocr_tool, ocr_array
from .vision import crop_array, make_crop_tool, make_image_zoom_in_tool, make_zoom_tool, zoom_array

if TYPE_CHECKING:
    from langchain_core.tools import BaseTool

crop = make_crop_tool()
zoom = make_zoom_tool()
image_zoom_in_tool = make_image_zoom_in_tool()


def __getattr__(name: str) -> BaseTool:
    # `ocr` is built lazily so importing the package works on machines without Tesseract;
    # using it there raises OCRUnavailable with install instructions.
    if name == "ocr":
        tool = make_ocr_tool()
        globals()["ocr"] = tool
        return tool
    raise AttributeError(name)


__all__ = [
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "make_python_sandbox_tool",
    "BlobStore",
    "BoxError",
    "Coordinates",
    "DeadlineExceeded",
    "DirectoryBlobs",
    "FsspecBlobs",
    "PostgresBlobs",
    "blobs_from_url",
    "ImageLoadError",
    "ImagePolicy",
    "ImagePolicyError",
    "ImageStore",
    "MemoryBlobs",
    "OCRUnavailable",
    "PixelBox",
    "ResizeSpec",
    "check_tesseract",
    "call_with_deadline",
    "clamp_box",
    "crop",
    "crop_array",
    "deadline_scope",
    "default_store",
    "encode_image",
    "image_zoom_in_tool",
    "load_image",
    "make_crop_tool",
    "make_image_zoom_in_tool",
    "make_ocr_tool",
    "make_zoom_tool",
    "ocr",
    "ocr_array",
    "parse_box",
    "put_bytes",
    "release",
    "smart_resize",
    "to_original",
    "zoom",
    "zoom_array",
]
