"""Measure the vision tools: crop/zoom on an 8K frame, OCR per call, peak memory of an 8K query.

Prints figures; asserts nothing. Usage: python3 scripts/bench_tools.py [--reps N]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def timeit(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, min(times) * 1000


def scene(w, h, seed=0, text_px=28):
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(200, 255, size=(h // 8, w // 8, 3), dtype=np.uint8)).resize(
        (w, h)
    )
    draw = ImageDraw.Draw(img)
    for _ in range(40):
        x, y = int(rng.integers(0, w - 200)), int(rng.integers(0, h - 200))
        draw.rectangle(
            (x, y, x + int(rng.integers(20, 200)), y + int(rng.integers(20, 200))),
            fill=tuple(int(c) for c in rng.integers(0, 255, 3)),
        )
    font = ImageFont.load_default(size=text_px)
    for i in range(12):
        draw.text(
            (100 + 300 * (i % 6), 200 + 500 * (i // 6)),
            f"STORE {i} OPEN 9AM",
            fill="black",
            font=font,
        )
    return img


def bench_crop_zoom(path, reps):
    from speceyes_tools import PixelBox, crop_array, default_store, zoom_array
    from speceyes_tools.vision import make_zoom_tool

    t0 = time.perf_counter()
    arr = default_store().get(str(path))
    decode_ms = (time.perf_counter() - t0) * 1000
    print(f"decode 7680x4320 PNG once: {decode_ms:.0f} ms ({arr.nbytes / 2**20:.0f} MiB RGB)")
    for name, box in [
        ("64 px box", PixelBox(4000, 2000, 4064, 2064)),
        ("1000 px box", PixelBox(1000, 1000, 2000, 2000)),
        ("4000x3000 box", PixelBox(100, 100, 4100, 3100)),
    ]:
        med, best = timeit(lambda b=box: crop_array(arr, b), reps)
        zmed, zbest = timeit(lambda b=box: zoom_array(arr, b), reps)
        print(
            f"  {name:<14} crop (view) {med:8.3f} ms   zoom (crop+resize) {zmed:7.2f} ms (best {zbest:.2f})"
        )
    tool = make_zoom_tool(coordinates="original")
    state = {"images": [str(path)]}
    med, best = timeit(lambda: tool.func(bbox=[4000, 2000, 4300, 2200], state=state), reps)
    print(f"  zoom tool end to end (map, clamp, zoom, PNG-encode the result): {med:.1f} ms median")


def bench_decode(reps):
    """The store's decode of an 800x600 photo per format, upright or turned: header (size,
    orientation, price) plus pixels. Reading the orientation must not decode the image
    (Pillow's PNG getexif() does: 7 ms became 30 ms before the header walk)."""
    import io

    from speceyes_tools import ImageStore

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (600, 800, 3), dtype=np.uint8)
    arr[:300] //= 16  # half noise, half nearly flat
    pil = Image.fromarray(arr)
    exif = Image.Exif()
    exif[0x0112] = 6
    print("decode 800x600, header + pixels (ms, median):")
    for name, fmt, extra in [
        ("PNG", "PNG", {}),
        ("PNG, EXIF 6", "PNG", {"exif": exif.tobytes()}),
        ("JPEG", "JPEG", {"quality": 90}),
        ("JPEG, EXIF 6", "JPEG", {"quality": 90, "exif": exif.tobytes()}),
        ("TIFF LZW, tag 6", "TIFF", {"compression": "tiff_lzw", "tiffinfo": {0x0112: 6}}),
        ("WebP", "WEBP", {"quality": 90}),
    ]:
        buf = io.BytesIO()
        pil.save(buf, format=fmt, **extra)
        data, store = buf.getvalue(), ImageStore(max_bytes=0)
        med, best = timeit(lambda d=data, st=store: st._decode(d, "bench"), reps)
        print(f"  {name:<16} {med:6.1f}   (best {best:.1f})")


WORDS = "store open exit main street north road hotel cafe bank park lane river stone market station 24 7 45 1990 B12 sale".split()


def rendered_line(px, rng, bg):
    words = [str(w) for w in rng.choice(WORDS, 4)]
    text = " ".join(w.upper() if rng.random() < 0.5 else w for w in words)
    font = ImageFont.load_default(size=px)
    img = Image.new("RGB", (int(font.getlength(text)) + 40, px + 40), bg)
    ImageDraw.Draw(img).text((20, 20), text, fill=(30, 30, 30), font=font)
    return np.asarray(img), text.split()


def ocr_preprocessing_table(n=12):
    """Word recall of Tesseract on rendered lines, by glyph size and preprocessing."""
    import cv2

    from speceyes_tools import ocr_array
    from speceyes_tools.tesseract import preprocess_for_ocr

    variants = {  # each spelled out, so a change of the default cannot relabel a column
        "raw RGB": lambda a: (a, False),
        "gray+upscale": lambda a: (preprocess_for_ocr(a, binarize=False)[0], False),
        "gray+upscale+otsu": lambda a: (preprocess_for_ocr(a, binarize=True)[0], False),
        "gray+otsu": lambda a: (
            cv2.threshold(
                cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU
            )[1],
            False,
        ),
    }
    print(f"OCR word recall on rendered text lines (n={n} per size):")
    print("  px  " + "".join(f"{name:>24}" for name in variants))
    for px in (8, 10, 12, 16, 24):
        rng = np.random.default_rng(px)
        samples = [
            rendered_line(px, rng, (230, 220, 200) if i % 2 else (255, 255, 255)) for i in range(n)
        ]
        row = []
        for make in variants.values():
            hit = total = 0
            for arr, truth in samples:
                image, pre = make(arr)
                out = {w["text"] for w in ocr_array(image, preprocess=pre, psm=6)["words"]}
                hit += sum(w in out for w in truth)
                total += len(truth)
            row.append(hit / total)
        print(f"  {px:>2}  " + "".join(f"{v:>24.2f}" for v in row))


def bench_ocr(path, reps):
    from speceyes_tools import default_store, ocr_array
    from speceyes_tools.tesseract import _has_tesserocr

    arr = default_store().get(str(path))
    small = np.ascontiguousarray(arr[180:240, 80:520])  # one line of 14 px text
    full4k = np.asarray(Image.fromarray(arr[: 4320 // 2 * 2, :]).resize((3840, 2160)))
    engines = ["pytesseract"] + (["tesserocr"] if _has_tesserocr() else [])
    for engine in engines:
        med, _ = timeit(lambda e=engine: ocr_array(small, engine=e), reps)
        t0 = time.perf_counter()
        res = ocr_array(full4k, engine=engine)
        full_ms = (time.perf_counter() - t0) * 1000
        print(
            f"OCR {engine:<11}: small crop {small.shape[1]}x{small.shape[0]} {med:6.0f} ms/call (median of {reps}); "
            f"full 3840x2160 {full_ms:6.0f} ms ({len(res['words'])} words)"
        )
    if len(engines) == 1:
        print(
            "  (tesserocr not installed: pip install 'speceyes-graph[fast-ocr]' for the persistent engine)"
        )


def peak_memory_8k_query(path):
    """Run one 8K query through the agent loop in a fresh process; report peak RSS growth."""
    code = f"""
import resource, json
from speceyes_graph import create_speceyes_graph
from speceyes_graph.models import ScriptedChatModel, fake_logprobs
from langchain_core.messages import AIMessage
import speceyes_graph.messages  # import everything before the baseline
def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (ru_maxrss survives exec from the parent)
base = status("VmRSS")
def agent(msgs):
    if "<tool_response>" in str(msgs[-1].content):
        return "<answer>A</answer>"
    return '<tool_call>{{"name": "image_zoom_in_tool", "arguments": {{"bbox_2d": [600, 300, 700, 380]}}}}</tool_call>'
g = create_speceyes_graph(judge=ScriptedChatModel(respond=lambda m: "no"),
    speculator=ScriptedChatModel(respond=lambda m: AIMessage(content="A", response_metadata={{"logprobs": fake_logprobs(["A"], [3.0])}})),
    agent=ScriptedChatModel(respond=agent)).compile()
out = g.invoke({{"question": "q?", "images": [{str(path)!r}]}})
peak = status("VmHWM")
print(json.dumps({{"route": out["route"], "steps": len(out["agent_steps"]), "base_mib": base / 1024, "peak_mib": peak / 1024, "timings": out["timings"]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"one 8K query (judge, draft rejected, 2 agent steps with a zoom): peak RSS {data['peak_mib']:.0f} MiB, "
        f"{data['peak_mib'] - data['base_mib']:.0f} MiB above the process after imports "
        f"(the decoded frame alone is {7680 * 4320 * 3 / 2**20:.0f} MiB); phases { ({k: round(v, 3) for k, v in data['timings'].items()}) }"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "8k.png"
        scene(7680, 4320).save(path, compress_level=1)
        print(f"machine: {resource.getpagesize()} B pages, python {sys.version.split()[0]}")
        bench_decode(args.reps * 2)
        bench_crop_zoom(path, args.reps)
        bench_ocr(path, max(3, args.reps // 4))
        ocr_preprocessing_table()
        peak_memory_8k_query(path)


if __name__ == "__main__":
    main()
