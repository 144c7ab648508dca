"""Decode under a capped address space (``RLIMIT_AS``): run by ``test_decoding.py``.

Writes a GIF that declares a 7000 x 7000 canvas in a few kilobytes (LZW codes of one colour:
a file that is cheap to send and expensive to decode), caps the address space at what the
process uses plus ``MARGIN_MB``, and decodes it twice: through a store whose decode budget is
below the cap (the header prices the decode, so it must be refused before any pixel is
allocated) and through one whose budget is above it (the decoder runs out of memory, which
must be reported as such). Between the two, the peak resident size (``VmHWM``, reset through
``/proc/self/clear_refs``) shows whether anything was allocated. Prints one JSON line.
glibc's mmap threshold is fixed by the caller (``MALLOC_MMAP_THRESHOLD_``) so large blocks
are returned to the system when freed.

    python tests/decode_capped.py FOLDER MARGIN_MB BUDGET_MB

With ``--measure`` instead of the two numbers, it writes an image in each of a
dozen formats (2 megapixels) and prints, per format, the peak resident memory its decode took beside the
price the header put on it (what the store's budget counts: ``decode_bytes`` plus the file).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from speceyes_tools import ImageLoadError, ImageStore
from speceyes_tools.images import read_header


def address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def attempt(store: ImageStore, path: str) -> dict:
    reset_peak()
    before = peak_rss()
    try:
        store.get(path)
        error = None
    except ImageLoadError as exc:
        error = str(exc)
    return {"error": error, "allocated_mb": (peak_rss() - before) / 2**20}


def measure(folder: Path) -> None:

    rng = np.random.default_rng(0)
    side = 1448  # 2 MP
    rgb = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    rgb[: side // 2] //= 8  # half noise, half nearly flat: some compression to undo
    pil = Image.fromarray(rgb)
    wide = (rng.integers(0, 65536, (side, side))).astype(np.uint16)
    writers = {
        "png-rgb": lambda p: pil.save(p, format="PNG", compress_level=1),
        "png-rgba": lambda p: pil.convert("RGBA").save(p, format="PNG", compress_level=1),
        "png-16bit": lambda p: Image.fromarray(wide).save(p, format="PNG", compress_level=1),
        "jpeg": lambda p: pil.save(p, format="JPEG", quality=90),
        "jpeg-cmyk": lambda p: pil.convert("CMYK").save(p, format="JPEG", quality=90),
        "tiff-lzw-turned": lambda p: pil.save(
            p, format="TIFF", compression="tiff_lzw", tiffinfo={0x0112: 6}
        ),
        "tiff-16bit": lambda p: Image.fromarray(wide).save(p, format="TIFF"),
        "gif": lambda p: pil.convert("P").save(p, format="GIF"),
        "bmp": lambda p: pil.save(p, format="BMP"),
        "webp": lambda p: pil.save(p, format="WEBP", quality=80),
        "jpeg2000": lambda p: pil.save(p, format="JPEG2000"),
        "avif": lambda p: pil.save(p, format="AVIF", quality=70, speed=10),
        "png-turned": lambda p: pil.save(p, format="PNG", compress_level=1, exif=_turned()),
        "jpeg-turned": lambda p: pil.save(p, format="JPEG", quality=90, exif=_turned()),
        "tga": lambda p: pil.save(p, format="TGA"),
        "dds": lambda p: pil.convert("RGBA").save(p, format="DDS"),
        "ppm": lambda p: pil.save(p, format="PPM"),
        "sgi": lambda p: pil.save(p, format="SGI"),
    }
    rows = []
    for name, write in writers.items():
        path = folder / f"m.{name}"
        write(path)
        # a fresh process per file: freed memory an earlier decode left mapped cannot hide
        # this one's peak
        done = subprocess.run(
            [sys.executable, __file__, str(path), "--measure-one"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append({"format": name, **json.loads(done.stdout)})
    print(json.dumps(rows))


def _turned() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6
    return exif.tobytes()


def measure_one(path: Path) -> None:
    from speceyes_tools.codec import decode_image

    data = path.read_bytes()
    header = read_header(data)
    reset_peak()
    before = current_rss()
    decode_image(data, path.name, header=header)
    peak = (peak_rss() - before) / 2**20
    price = (header.decode_bytes + len(data)) / 2**20
    print(json.dumps({"peak_mb": round(peak, 1), "price_mb": round(price, 1)}))


def current_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def main() -> None:
    if sys.argv[2] == "--measure":
        measure(Path(sys.argv[1]))
        return
    if sys.argv[2] == "--measure-one":
        measure_one(Path(sys.argv[1]))
        return
    folder, margin_mb, budget_mb = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    path = folder / "canvas.gif"
    Image.new("P", (7000, 7000), 0).save(path)
    header = read_header(path.read_bytes())
    cap = address_space() + margin_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    refused = attempt(ImageStore(max_decode_bytes=budget_mb * 2**20), str(path))
    attempted = attempt(ImageStore(max_decode_bytes=64 * 2**30), str(path))
    print(
        json.dumps(
            {
                "file_bytes": path.stat().st_size,
                "decode_mb": header.decode_bytes / 2**20,
                "refused": refused,
                "attempted": attempted,
            }
        )
    )


if __name__ == "__main__":
    main()
