"""OCR with Tesseract, on the whole image or a box, returning text plus word boxes.

Preprocessing is what measurably helps Tesseract on small text: grayscale and upscaling
small regions (x2/x3 cubic). Otsu binarisation is off unless asked for: on top of that it
costs recall on the smallest text, and alone it does not help (``scripts/bench_tools.py``
measures it; the figures are in the tools reference, docs/api/tools.md).

Two engines: ``tesserocr`` (a persistent in-process Tesseract, no process start per call,
used when installed: ``pip install speceyes-graph[fast-ocr]``) and ``pytesseract`` (one
``tesseract`` process per call, the fallback).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import threading
import time
from typing import Annotated, Literal

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
    region: np.ndarray, *, upscale_below: int = 1000, binarize: bool = False
) -> tuple[np.ndarray, float]:
    """Grayscale, upscale small regions (x2 or x3, cubic), Otsu only when asked (it costs
    recall on small text: docs/api/tools.md). Returns (image, scale)."""
    gray = cv2.cvtColor(region, cv2.COLOR_RGB2GRAY) if region.ndim == 3 else region
    long_side = max(gray.shape[:2])
    scale = 1.0
    if long_side < upscale_below:
        scale = 3.0 if long_side < upscale_below / 3 else 2.0
        gray = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC)
    if binarize:
        _, gray = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    return gray, scale


_local = threading.local()


@functools.lru_cache(maxsize=4)
def _tessdata_dir(tesseract_cmd: str) -> str | None:
    """Where the installed language data lives (tesserocr needs it explicitly)."""
    if os.environ.get("TESSDATA_PREFIX"):
        return os.environ["TESSDATA_PREFIX"]
    out = subprocess.run(
        [tesseract_cmd, "--list-langs"], capture_output=True, text=True, check=False
    )
    match = re.search(r'"([^"]+)"', out.stdout + out.stderr)
    return match.group(1) if match else None


def _tesserocr_api(lang: str, psm: int, tesseract_cmd: str):
    """One persistent engine per thread and setting (Tesseract handles are not thread-safe)."""
    import tesserocr

    cache = _local.__dict__.setdefault("apis", {})
    key = (lang, psm)
    if key not in cache:
        path = _tessdata_dir(tesseract_cmd)
        kwargs = {"path": path.rstrip("/") + "/"} if path else {}
        cache[key] = tesserocr.PyTessBaseAPI(lang=lang, psm=psm, **kwargs)
    return cache[key]


def _has_tesserocr() -> bool:
    try:
        import tesserocr  # noqa: F401
    except ImportError:
        return False
    return True


def _words_tesserocr(image: np.ndarray, lang: str, psm: int, tesseract_cmd: str) -> dict[str, list]:
    import tesserocr
    from PIL import Image

    api = _tesserocr_api(lang, psm, tesseract_cmd)
    api.SetImage(Image.fromarray(image))
    api.Recognize()
    data: dict[str, list] = {
        k: []
        for k in (
            "text",
            "conf",
            "left",
            "top",
            "width",
            "height",
            "block_num",
            "par_num",
            "line_num",
        )
    }
    line = 0
    it = api.GetIterator()
    level = tesserocr.RIL.WORD
    for word in tesserocr.iterate_level(it, level) if it is not None else ():
        try:
            text = word.GetUTF8Text(level)
        except RuntimeError:  # tesserocr raises on an empty result instead of returning ""
            continue
        box = word.BoundingBox(level)
        if not text or box is None:
            continue
        if word.IsAtBeginningOf(tesserocr.RIL.TEXTLINE):
            line += 1
        x1, y1, x2, y2 = box
        for k, v in (
            ("text", text),
            ("conf", word.Confidence(level)),
            ("left", x1),
            ("top", y1),
            ("width", x2 - x1),
            ("height", y2 - y1),
            ("block_num", 0),
            ("par_num", 0),
            ("line_num", line),
        ):
            data[k].append(v)
    return data


def ocr_array(
    region: np.ndarray,
    *,
    offset: tuple[int, int] = (0, 0),
    preprocess: bool = True,
    lang: str = "eng",
    psm: int | None = None,
    tesseract_cmd: str | None = None,
    min_confidence: float = 0.0,
    engine: Literal["auto", "tesserocr", "pytesseract"] = "auto",
) -> dict:
    """Run Tesseract on an RGB/gray array; word boxes come back in original-image pixels."""
    import pytesseract

    cmd = check_tesseract(tesseract_cmd)
    image, scale = preprocess_for_ocr(region) if preprocess else (region, 1.0)
    if psm is None:
        psm = 6 if max(region.shape[:2]) < 1000 else 3
    if engine == "tesserocr" or (engine == "auto" and _has_tesserocr()):
        data = _words_tesserocr(np.ascontiguousarray(image), lang, psm, cmd)
    else:
        pytesseract.pytesseract.tesseract_cmd = cmd
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
    engine: Literal["auto", "tesserocr", "pytesseract"] = "auto",
    store: ImageStore | None = None,
) -> BaseTool:
    """An OCR tool reading the whole image or a box; fails at build time without Tesseract."""
    check_tesseract(tesseract_cmd)
    if engine not in ("auto", "tesserocr", "pytesseract"):
        raise ValueError(f"unknown OCR engine {engine!r}; use auto, tesserocr or pytesseract")
    if engine == "tesserocr" and not _has_tesserocr():
        raise OCRUnavailable("engine='tesserocr' needs: pip install tesserocr")
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
            engine=engine,
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
