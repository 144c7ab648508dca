"""Bytes to pixels by one rule, once per image, priced before it is paid, failing clearly.

The rule (``speceyes_tools.codec``): the first frame, upright, 8-bit RGB with wide samples
scaled by their declared bit depth. These tests hold every path to it, count the decoders'
own calls through whole queries, and check that the memory a decode takes is what the header
said before any pixel existed.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile
from test_orientation import exif_after_pixels, save_tiff, save_with_orientation

from speceyes_tools import ImageLoadError, load_image
from speceyes_tools.codec import decode_image, read_header

HERE = Path(__file__).parent


# --- counting the decoders' own calls ---------------------------------------------------------


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


@pytest.fixture
def pixel_decodes(monkeypatch):
    """How many times each image's pixels were decoded, by the decoders themselves: OpenCV's
    imdecode and Pillow's load_prepare (which every Pillow decode runs once, libtiff's and
    WebP's too), keyed by the hash of the encoded bytes the image was opened from. A header
    read that decodes (Pillow's PNG getexif does) counts here, where the store's own counter
    would not see it."""
    import cv2

    calls: collections.Counter = collections.Counter()
    real_imdecode, real_prepare, real_open = (
        cv2.imdecode,
        ImageFile.ImageFile.load_prepare,
        Image.open,
    )

    def imdecode(buf, flags):
        calls[_digest(bytes(buf))] += 1
        return real_imdecode(buf, flags)

    def open_(fp, *args, **kwargs):
        im = real_open(fp, *args, **kwargs)
        source = fp.getvalue() if isinstance(fp, io.BytesIO) else Path(fp).read_bytes()
        im.encoded_digest = _digest(source)  # a decoder may swap im.fp (WebP does)
        return im

    def load_prepare(self):
        calls[getattr(self, "encoded_digest", "?")] += 1
        return real_prepare(self)

    monkeypatch.setattr(cv2, "imdecode", imdecode)
    monkeypatch.setattr(Image, "open", open_)
    monkeypatch.setattr(ImageFile.ImageFile, "load_prepare", load_prepare)
    return calls


def formats_of(folder: Path, sources: list[str]) -> list[str]:
    """The demo's scenes as a phone, a scanner and a browser would send them: a portrait
    JPEG and a PNG whose EXIF follows the pixels (orientation 6), a TIFF (orientation 8), a
    WebP (orientation 3)."""
    out = []
    for i, src in enumerate(sources):
        upright = np.asarray(Image.open(src).convert("RGB"))
        kind = i % 4
        if kind == 0:
            out.append(save_with_orientation(folder / f"{i}.jpg", upright, 6, "JPEG"))
        elif kind == 1:
            png = save_with_orientation(folder / f"{i}.png", upright, 6, "PNG")
            out.append(exif_after_pixels(png))
        elif kind == 2:
            out.append(save_tiff(folder / f"{i}.tif", upright, 8, "tiff_lzw"))
        else:
            out.append(save_with_orientation(folder / f"{i}.webp", upright, 3, "WEBP"))
    return out


def test_each_image_is_decoded_once_through_whole_queries(demo_local, tmp_path, pixel_decodes):
    """Intake, the judge, the draft, the agent's turns and its zoom tool, on the demo
    checkpoints: every image, the inputs and each crop the tool returns, is decoded once."""
    from speceyes_graph import create_speceyes_graph
    from speceyes_graph.demo import DEMO_GRAPH_SETTINGS, demo_queries

    queries = demo_queries(tmp_path / "scenes", 8, micro_share=0.0)  # 3 of them need the zoom
    paths = formats_of(tmp_path, [q.image for q in queries])
    graph = create_speceyes_graph(
        speculator=demo_local["small"], agent=demo_local["large"], **DEMO_GRAPH_SETTINGS
    ).compile()
    inputs = [
        {"question": q.question, "images": [p], "options": q.options}
        for q, p in zip(queries, paths, strict=True)
    ]
    pixel_decodes.clear()
    outs = graph.batch(inputs, {"max_concurrency": 8})
    assert all(o.get("error") is None for o in outs), [o.get("error") for o in outs]
    zooms = sum(len(o.get("agent_steps") or []) for o in outs)
    assert any(o["route"] != "accepted" for o in outs) and zooms > 0
    assert {_digest(Path(p).read_bytes()) for p in paths} <= set(pixel_decodes)  # every input
    assert set(pixel_decodes.values()) == {1}, pixel_decodes  # and every image, only once


def test_reading_a_header_decodes_nothing(tmp_path, pixel_decodes):
    """Size and orientation of every format from the header alone (a PNG's EXIF after its
    pixels included: Pillow's own getexif would decode the image to find it)."""
    upright = np.zeros((40, 60, 3), np.uint8)
    paths = formats_of(tmp_path, [_png(tmp_path / f"s{i}.png", upright) for i in range(4)])
    pixel_decodes.clear()
    headers = [read_header(open(p, "rb").read(), p) for p in paths]
    assert [h.orientation for h in headers] == [6, 6, 8, 3]
    assert not pixel_decodes


def _png(path: Path, arr: np.ndarray) -> str:
    Image.fromarray(arr).save(path)
    return str(path)


# --- one rule: first frame, wide samples by their declared depth --------------------------------


def test_sixteen_bit_samples_are_scaled_by_their_bit_depth_in_every_format(tmp_path):
    """PNG goes through OpenCV and TIFF through Pillow; both show the high byte of a 16-bit
    sample (as browsers do), where Pillow's own grey conversion would clip at 255."""
    ramp = (np.arange(256 * 64, dtype=np.uint32).reshape(64, 256) * 4).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    Image.fromarray(ramp).save(tmp_path / "ramp.tif")
    with Image.open(tmp_path / "ramp.png") as im:
        assert im.mode == "I;16"
    expected = np.repeat((ramp >> 8).astype(np.uint8)[..., None], 3, axis=2)
    for name in ("ramp.png", "ramp.tif"):
        assert np.array_equal(load_image(str(tmp_path / name)), expected), name
    low = np.tile(np.arange(256, dtype=np.uint16), (8, 1))  # a 16-bit file holding 0..255
    Image.fromarray(low).save(tmp_path / "low.png")
    assert load_image(str(tmp_path / "low.png")).max() == 0  # near black, as declared


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "WEBP", "TIFF"])
def test_animations_and_pages_show_their_first_frame_everywhere(tmp_path, fmt):
    frames = [Image.new("RGB", (32, 24), c) for c in ((200, 0, 0), (0, 0, 200), (0, 200, 0))]
    path = tmp_path / f"anim.{fmt.lower()}"
    frames[0].save(path, format=fmt, save_all=True, append_images=frames[1:], duration=50)
    with Image.open(path) as im:
        assert getattr(im, "n_frames", 1) == 3
        first = np.asarray(im.convert("RGB"))
    ours = load_image(str(path))
    assert np.abs(ours.astype(int) - first.astype(int)).max() <= 2  # WebP is lossy
    assert ours[..., 0].mean() > 150  # red: the first frame
    # the sandbox's output images are decoded by the same function
    assert np.array_equal(decode_image(path.read_bytes()), ours)


# --- failures: always an ImageLoadError that names the image and why -----------------------------


@pytest.mark.parametrize(
    ("exc", "says"),
    [
        (NotImplementedError("DXT10 variant"), "uses a variant this server cannot decode: DXT10"),
        (Image.DecompressionBombError("too big"), "decompression-bomb limit"),
        (MemoryError(), "out of memory decoding image"),
        (KeyError("tile"), "could not be decoded (KeyError"),
        (OSError("decoder zip not available"), "Pillow was built without the zip decoder"),
        (struct.error("unpack"), "is corrupt or truncated: unpack"),
    ],
)
def test_whatever_a_decoder_raises_is_an_image_load_error(tmp_path, monkeypatch, exc, says):
    path = tmp_path / "odd.bmp"
    Image.new("RGB", (20, 10)).save(path)

    def broken(self):
        raise exc

    monkeypatch.setattr(ImageFile.ImageFile, "load", broken)
    with pytest.raises(ImageLoadError) as caught:
        load_image(str(path))
    message = str(caught.value)
    assert str(path) in message and "(BMP" in message and says in message


def test_what_this_host_cannot_read_is_named_as_such(tmp_path):
    heif = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64)
    box = b"".join(v.to_bytes(2, "little") for v in (0, 0, 100, 100, 72))  # bounds, inch
    wmf = b"\xd7\xcd\xc6\x9a\x00\x00" + box + bytes(6) + b"\x01\x00\t\x00" + bytes(40)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n%%EndComments\nshowpage\n"
    svg = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'
    cases = {
        "photo.heic": (heif, "(HEIF): it needs a HEIF decoder (the pillow-heif plugin)"),
        "drawing.wmf": (wmf, "(WMF): Pillow renders them only on Windows"),
        "figure.eps": (eps, "(EPS): Ghostscript is not installed"),
        "logo.svg": (svg, "(SVG): it needs a vector renderer"),
    }
    from PIL import EpsImagePlugin

    if EpsImagePlugin.has_ghostscript():  # where Ghostscript is installed, EPS is readable
        cases.pop("figure.eps")
    for name, (data, says) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ImageLoadError, match="this server cannot read image") as caught:
            load_image(str(tmp_path / name))
        assert str(tmp_path / name) in str(caught.value) and says in str(caught.value), name


# --- memory: priced from the header, refused before the allocation -----------------------------


def test_a_cheap_canvas_is_refused_before_its_pixels_exist(tmp_path):
    """Under an address-space cap: a 37 KB GIF that declares 49 MP is priced at what its
    decode takes (about 514 MiB, not the 147 MiB of its RGB array) and refused by a store
    whose budget is smaller, with nothing allocated; a store that would allow it runs out of
    memory inside the decoder, and says so."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run(
        [sys.executable, str(HERE / "decode_capped.py"), str(tmp_path), "300", "200"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file_bytes"] < 100_000 and result["decode_mb"] > 300
    refused = result["refused"]
    assert "more than this store's decode budget of 200 MiB" in refused["error"]
    assert refused["allocated_mb"] < 16  # refused from the header: no pixel allocated
    attempted = result["attempted"]
    assert (
        "out of memory decoding image" in attempted["error"] and "7000x7000" in attempted["error"]
    )


def test_the_price_covers_what_decodes_take(tmp_path):
    """Peak resident memory of real decodes (2 MP, each format's own decoder) against the
    header's price: the budget must never undercount."""
    done = subprocess.run(
        [sys.executable, str(HERE / "decode_capped.py"), str(tmp_path), "--measure"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(rows) >= 10
    under = {r["format"]: r for r in rows if r["peak_mb"] > r["price_mb"]}
    assert not under, under
