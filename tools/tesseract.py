"""OCR with Tesseract, on the whole image or a box, returning text plus word boxes.

Preprocessing follows what helps Tesseract on small text: grayscale, upscaling small
regions (Tesseract wants ~20-30 px glyphs; HR-Bench text is often 10-15 px) and Otsu
binarisation. ``scripts/bench_tools.py`` measures it against raw input.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Annotated

import cv2
import numpy as np
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, Field

from .geometry import MIN_SIDE, Coordinates, PixelBox
from .images import ImageStore, ResizeSpec
from .vision import crop_array, query_image, resolve_box

__all__ = ["OCRUnavailable", "check_tesseract", "make_ocr_tool", "ocr_array", "preprocess_for_ocr"]


class OCRUnavailable(RuntimeError):
    """The Tesseract binary is not installed or not on PATH."""


def check_tesseract(tesseract_cmd: str | None = None) -> str:
    """Path of the tesseract binary, or a clear :class:`OCRUnavailable` error."""
    import pytesseract

    cmd = tesseract_cmd or pytesseract.pytesseract.tesseract_cmd
    found = shutil.which(cmd)
    if not found:
        raise OCRUnavailable(
            f"the OCR tool needs the Tesseract binary, but {cmd!r} was not found on PATH. "
            "Install it (Debian/Ubuntu: apt-get install tesseract-ocr; macOS: brew install "
            "tesseract) or pass tesseract_cmd=/path/to/tesseract, or drop 'ocr' from the toolset."
        )
    return found


def preprocess_for_ocr(
    region: np.ndarray, *, upscale_below: int = 1000, binarize: bool = True
) -> tuple[np.ndarray, float]:
    """Grayscale, upscale small regions (x2 or x3, cubic), Otsu. Returns (image, scale)."""
    gray = cv2.cvtColor(region, cv2.COLOR_RGB2GRAY) if region.ndim == 3 else region
    long_side = max(gray.shape[:2])
    scale = 1.0
    if long_side < upscale_below:
        scale = 3.0 if long_side < upscale_below / 3 else 2.0
        gray = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    if binarize:
        _, gray = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    return gray, scale


def ocr_array(
    region: np.ndarray,
    *,
    offset: tuple[int, int] = (0, 0),
    preprocess: bool = True,
    lang: str = "eng",
    psm: int | None = None,
    tesseract_cmd: str | None = None,
    min_confidence: float = 0.0,
) -> dict:
    """Run Tesseract on an RGB/gray array; word boxes come back in original-image pixels."""
    import pytesseract

    check_tesseract(tesseract_cmd)
    if tesseract_cmd:
        pytesseract.pytesseract.tesseract_cmd = tesseract_cmd
    image, scale = preprocess_for_ocr(region) if preprocess else (region, 1.0)
    if psm is None:
        psm = 6 if max(region.shape[:2]) < 1000 else 3
    data = pytesseract.image_to_data(
        image, lang=lang, config=f"--psm {psm}", output_type=pytesseract.Output.DICT
    )
    words = []
    lines: dict[tuple[int, int, int], list[str]] = {}
    ox, oy = offset
    for i, word in enumerate(data["text"]):
        word = word.strip()
        conf = float(data["conf"][i])
        if not word or conf < min_confidence:
            continue
        x, y, w, h = (data[k][i] / scale for k in ("left", "top", "width", "height"))
        words.append(
            {
                "text": word,
                "box": [round(ox + x), round(oy + y), round(ox + x + w), round(oy + y + h)],
                "confidence": round(conf, 1),
            }
        )
        lines.setdefault(
            (data["block_num"][i], data["par_num"][i], data["line_num"][i]), []
        ).append(word)
    text = "\n".join(" ".join(ws) for _, ws in sorted(lines.items()))
    return {"text": text, "words": words}


class _OCRArgs(BaseModel):
    bbox: list[float] | None = Field(
        default=None,
        description="Optional region [x1, y1, x2, y2] to read; omit to read the whole image.",
    )
    image_index: int = Field(default=0, description="Which of the query's images (0 = the first).")
    state: Annotated[dict, InjectedState]


def make_ocr_tool(
    *,
    name: str = "ocr",
    coordinates: Coordinates = "model",
    resize: ResizeSpec | None = None,
    min_side: int = MIN_SIDE,
    preprocess: bool = True,
    lang: str = "eng",
    tesseract_cmd: str | None = None,
    store: ImageStore | None = None,
) -> BaseTool:
    """An OCR tool reading the whole image or a box; fails at build time without Tesseract."""
    check_tesseract(tesseract_cmd)
    resize = resize or ResizeSpec()

    def ocr(state: dict, bbox: list[float] | None = None, image_index: int = 0):
        t0 = time.perf_counter()
        ref, image = query_image(state, image_index, store)
        h, w = image.shape[:2]
        box = (
            PixelBox(0, 0, w, h)
            if bbox is None
            else resolve_box(bbox, image, coordinates, resize, min_side)
        )
        result = ocr_array(
            crop_array(image, box),
            offset=(box.x1, box.y1),
            preprocess=preprocess,
            lang=lang,
            tesseract_cmd=tesseract_cmd,
        )
        content = json.dumps({"text": result["text"], "words": result["words"][:200]})
        artifact = {
            "tool": name,
            "box": box.as_list(),
            "notes": list(box.notes),
            "image": ref,
            "n_words": len(result["words"]),
            "latency_s": time.perf_counter() - t0,
        }
        return content, artifact

    return StructuredTool.from_function(
        ocr,
        name=name,
        description=(
            "Read printed text in the image (or in the region bbox = [x1, y1, x2, y2]) with OCR. "
            "Returns JSON with the text and each word's box and confidence (0-100)."
        ),
        args_schema=_OCRArgs,
        response_format="content_and_artifact",
        handle_tool_error=True,
    )
