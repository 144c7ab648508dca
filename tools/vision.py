"""Crop and zoom: OpenCV on arrays, exposed as LangChain tools.

The tools read the query's images from graph state (``InjectedState``): the SpecEyes
graph's ``images``, or, in an agent whose state is messages (LangChain's ``create_agent``,
``SpecEyesMiddleware``'s agents), the latest human message's images. The model names a box
and, optionally, which image; it never names a file. A crop is a NumPy view of the
cached original (no copy of an 8K frame per step); only the zoomed output is new memory.
Results that are images come back as a standard LangChain image content block, so the
next model turn sees them; the artifact keeps the trace (box after clamping, notes, sizes).
"""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any

import cv2
import numpy as np
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, Field

from .geometry import (
    MIN_SIDE,
    BoxError,
    Coordinates,
    PixelBox,
    clamp_box,
    limit_aspect,
    parse_box,
    to_original,
)
from .images import (
    ImageLoadError,
    ImageStore,
    ResizeSpec,
    default_store,
    encode_image,
    smart_resize,
)

__all__ = [
    "crop_array",
    "zoom_array",
    "make_crop_tool",
    "make_zoom_tool",
    "make_image_zoom_in_tool",
    "message_images",
    "resolve_box",
    "query_image",
]


def crop_array(image: np.ndarray, box: PixelBox) -> np.ndarray:
    """The pixels inside ``box`` as a view (no copy)."""
    return image[box.y1 : box.y2, box.x1 : box.x2]


def zoom_array(
    image: np.ndarray,
    box: PixelBox,
    *,
    min_side: int = 224,
    factor: int = 28,
    max_pixels: int = 16384 * 28 * 28,
) -> np.ndarray:
    """Crop, then resize so the short side is at least ``min_side`` and sides are multiples
    of ``factor`` (what a Qwen-VL processor would do anyway), within ``max_pixels``."""
    crop = crop_array(image, box)
    h, w = crop.shape[:2]
    scale = max(1.0, min_side / min(h, w))
    th, tw = smart_resize(
        max(1, round(h * scale)), max(1, round(w * scale)), factor, factor * factor * 4, max_pixels
    )
    if (th, tw) == (h, w):
        return np.ascontiguousarray(crop)
    interp = cv2.INTER_CUBIC if th * tw > h * w else cv2.INTER_AREA
    return cv2.resize(crop, (tw, th), interpolation=interp)


def query_image(
    state: Any, image_index: int, store: ImageStore | None = None
) -> tuple[str, np.ndarray]:
    """The decoded image the model refers to: the graph state's ``images`` list, or, in an
    agent whose state is its messages (``create_agent``), the images of the latest human
    message that has any."""
    store = store or default_store()
    images = _state_value(state, "images")
    if not images:
        images = message_images(_state_value(state, "messages") or [], store)
    if not images:
        raise ToolException(
            "no image is attached to this query (no state['images'], and no human message "
            "with an image)"
        )
    if isinstance(images, str):
        images = [images]
    if not isinstance(image_index, int) or not 0 <= image_index < len(images):
        raise ToolException(
            f"image_index {image_index!r} is out of range: this query has {len(images)} image(s), "
            f"indexed 0..{len(images) - 1}"
        )
    ref = images[image_index]
    try:
        return ref, store.get(ref)
    except ImageLoadError:
        raise  # not the model's fault: the query fails with a clear error
    except Exception as exc:  # pragma: no cover - defensive
        raise ImageLoadError(
            f"could not load image {image_index}: {type(exc).__name__}: {exc}"
        ) from exc


def _state_value(state: Any, key: str) -> Any:
    return (state or {}).get(key) if isinstance(state, dict) else getattr(state, key, None)


def message_images(messages: Any, store: ImageStore) -> list[str]:
    """References of the images of the latest human message that has any: ``blob://`` keys
    and URLs as they are, inline base64 put into ``store`` (its key). Messages are LangChain
    messages or their dicts; anything else is skipped."""
    for message in reversed(list(messages)):
        kind = _state_value(message, "type") or _state_value(message, "role")
        if kind not in ("human", "user"):
            continue
        content = _state_value(message, "content")
        refs = [
            ref
            for block in (content if isinstance(content, list) else [])
            if (ref := _block_image(block, store)) is not None
        ]
        if refs:
            return refs
    return []


def _block_image(block: Any, store: ImageStore) -> str | None:
    """The reference of one content block, if it is an image (LangChain or OpenAI format)."""
    if not isinstance(block, dict):
        return None
    if block.get("type") == "image":
        if block.get("base64"):
            data = block["base64"]
            try:
                return store.put(data if isinstance(data, bytes) else base64.b64decode(data))
            except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
                raise ImageLoadError(f"an image of the message is not valid base64: {exc}") from None
        url = block.get("url")
        return url if isinstance(url, str) and url else None
    if block.get("type") == "image_url":
        url = block.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return url if isinstance(url, str) and url else None
    return None


def resolve_box(
    raw_box: object,
    image: np.ndarray,
    coordinates: Coordinates,
    resize: ResizeSpec,
    min_side: int = MIN_SIDE,
) -> PixelBox:
    """Model box -> clamped original-pixel box, or ToolException with a message for the model."""
    height, width = image.shape[:2]
    try:
        box = to_original(parse_box(raw_box), (width, height), coordinates, resize)
        return clamp_box(box, width, height, min_side)
    except BoxError as exc:
        raise ToolException(f"Error: invalid bbox: {exc}") from None


class _BoxArgs(BaseModel):
    bbox: list[float] = Field(
        description="Region as [x1, y1, x2, y2]: (x1, y1) top-left and (x2, y2) bottom-right corner."
    )
    image_index: int = Field(default=0, description="Which of the query's images (0 = the first).")
    state: Annotated[dict[str, Any], InjectedState]


class _DeepEyesArgs(BaseModel):
    bbox_2d: list[float] = Field(
        description=(
            "The bounding box of the region to zoom in, as [x1, y1, x2, y2], where (x1, y1) is "
            "the top-left corner and (x2, y2) is the bottom-right corner."
        ),
        min_length=4,
        max_length=4,
    )
    label: str | None = Field(
        default=None,
        description="The name or label of the object in the specified bounding box (optional).",
    )
    state: Annotated[dict[str, Any], InjectedState]


def _image_result(
    name: str, out: np.ndarray, box: PixelBox, ref: str, t0: float, label: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    h, w = out.shape[:2]
    text = f"{name}: region {box.as_list()} of the original image, shown at {w}x{h}."
    if box.notes:
        text += " Note: " + "; ".join(box.notes) + "."
    content = [
        {"type": "text", "text": text},
        {"type": "image", "base64": encode_image(out), "mime_type": "image/png"},
    ]
    artifact = {
        "tool": name,
        "box": box.as_list(),
        "notes": list(box.notes),
        "output_size": [w, h],
        "image": ref,
        "label": label,
        "latency_s": time.perf_counter() - t0,
    }
    return content, artifact


def make_crop_tool(
    *,
    name: str = "crop",
    coordinates: Coordinates = "model",
    resize: ResizeSpec | None = None,
    min_side: int = MIN_SIDE,
    max_output_pixels: int = 16384 * 28 * 28,
    store: ImageStore | None = None,
) -> BaseTool:
    """A crop tool: the region at native resolution (downscaled only past ``max_output_pixels``)."""
    resize = resize or ResizeSpec()

    def crop(
        bbox: list[float], state: dict[str, Any], image_index: int = 0
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        t0 = time.perf_counter()
        ref, image = query_image(state, image_index, store)
        box = resolve_box(bbox, image, coordinates, resize, min_side)
        out = crop_array(image, box)
        if out.shape[0] * out.shape[1] > max_output_pixels:
            out = zoom_array(image, box, min_side=1, factor=1, max_pixels=max_output_pixels)
        return _image_result(name, out, box, ref, t0)

    return StructuredTool.from_function(
        crop,
        name=name,
        description=(
            "Crop a region of the image and look at it at full resolution. "
            f"bbox is [x1, y1, x2, y2] in {_frame(coordinates)}."
        ),
        args_schema=_BoxArgs,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


def make_zoom_tool(
    *,
    name: str = "zoom",
    coordinates: Coordinates = "model",
    resize: ResizeSpec | None = None,
    min_side: int = MIN_SIDE,
    min_output_side: int = 224,
    max_aspect: float = 100.0,
    max_output_pixels: int = 16384 * 28 * 28,
    store: ImageStore | None = None,
) -> BaseTool:
    """A zoom tool: crop, then enlarge so small details become visible to the model."""
    resize = resize or ResizeSpec()

    def zoom(
        bbox: list[float], state: dict[str, Any], image_index: int = 0
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        t0 = time.perf_counter()
        ref, image = query_image(state, image_index, store)
        h, w = image.shape[:2]
        box = limit_aspect(
            resolve_box(bbox, image, coordinates, resize, min_side), w, h, max_aspect
        )
        out = zoom_array(
            image, box, min_side=min_output_side, factor=resize.factor, max_pixels=max_output_pixels
        )
        return _image_result(name, out, box, ref, t0)

    return StructuredTool.from_function(
        zoom,
        name=name,
        description=(
            "Zoom in on a region of the image: crop it and enlarge it so small objects and text "
            f"become readable. bbox is [x1, y1, x2, y2] in {_frame(coordinates)}."
        ),
        args_schema=_BoxArgs,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


def make_image_zoom_in_tool(
    *,
    coordinates: Coordinates = "model",
    resize: ResizeSpec | None = None,
    min_side: int = MIN_SIDE,
    min_output_side: int = 56,
    max_aspect: float = 100.0,
    store: ImageStore | None = None,
) -> BaseTool:
    """DeepEyes' tool, with the exact name and arguments the model was trained on.

    The crop is resized like the DeepEyes evaluation code does (smart resize, factor 28,
    at least 4x28x28 pixels); it always zooms into the query's first image.
    """
    resize = resize or ResizeSpec()

    def image_zoom_in_tool(
        bbox_2d: list[float], state: dict[str, Any], label: str | None = None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        t0 = time.perf_counter()
        ref, image = query_image(state, 0, store)
        h, w = image.shape[:2]
        box = limit_aspect(
            resolve_box(bbox_2d, image, coordinates, resize, min_side), w, h, max_aspect
        )
        out = zoom_array(image, box, min_side=min_output_side, factor=28)
        return _image_result("image_zoom_in_tool", out, box, ref, t0, label)

    return StructuredTool.from_function(
        image_zoom_in_tool,
        name="image_zoom_in_tool",
        description=(
            "Zoom in on a specific region of an image by cropping it based on a bounding box "
            "(bbox) and an optional object label."
        ),
        args_schema=_DeepEyesArgs,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )


def _frame(coordinates: Coordinates) -> str:
    frames = {
        "model": "pixels of the image as you see it",
        "original": "pixels of the original image",
        "normalized": "fractions 0-1 of the image width and height",
        "thousand": "relative coordinates from 0 to 1000",
    }
    if coordinates not in frames:
        raise ValueError(f"unknown coordinates {coordinates!r}; use one of {sorted(frames)}")
    return frames[coordinates]
