"""Formats Pillow cannot read: named by their signature, read where OpenCV can, sized first.

Before ``speceyes_tools.formats``, a valid OpenEXR render, a 12-bit JPEG or a Radiance HDR
file was called "corrupt or truncated (or not an image)", and a 289 MP AVIF got that message
instead of the size limit's. The files here are written by real encoders: OpenCV in the test
(HDR, PFM, float TIFF, AVIF), the format's specification by hand where it is a few bytes of
header (farbfeld, XCF, DICOM, SVGZ), and imagecodecs/OpenEXR for the committed fixtures
(``tests/fixtures/formats/make_fixtures.py``).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from io import BytesIO
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from speceyes_tools import ImageLoadError, load_image
from speceyes_tools.images import ImagePolicy

FIXTURES = Path(__file__).parent / "fixtures" / "formats"


def _gradient() -> np.ndarray:
    """32x48 RGB floats in 0.0-1.0 (the fixtures' 12-bit gradient, scaled)."""
    y, x = np.mgrid[0:32, 0:48]
    return (np.stack([x * 80, y * 120, (x + y) * 50], -1) / 4095.0).astype(np.float32)


def _srgb(linear: np.ndarray) -> np.ndarray:
    v = np.clip(linear, 0, 1)
    return np.where(v <= 0.0031308, 12.92 * v, 1.055 * v ** (1 / 2.4) - 0.055)


def _bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[..., ::-1])


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def readable(tmp_path_factory) -> dict[str, tuple[str, np.ndarray, int]]:
    """name -> (path, the pixels a viewer shows, tolerance in 8-bit steps)."""
    folder = tmp_path_factory.mktemp("readable")
    rgb = _gradient()
    files: dict[str, tuple[str, np.ndarray, int]] = {}
    cv2.imwrite(str(folder / "sky.hdr"), _bgr(rgb))  # RGBE: 8-bit mantissas, shared exponent
    files["Radiance HDR"] = (str(folder / "sky.hdr"), _srgb(rgb) * 255, 3)
    cv2.imwrite(str(folder / "depth.pfm"), _bgr(rgb))
    files["PFM"] = (str(folder / "depth.pfm"), rgb * 255, 1)
    cv2.imwrite(str(folder / "float.tif"), _bgr(rgb))  # float RGB: Pillow has no such mode
    files["TIFF"] = (str(folder / "float.tif"), rgb * 255, 1)
    wide = np.round(rgb * 65535).astype(np.uint16)
    rgba = np.concatenate([wide, np.full((32, 48, 1), 65535, np.uint16)], axis=2)
    farbfeld = b"farbfeld" + struct.pack(">II", 48, 32) + rgba.astype(">u2").tobytes()
    files["farbfeld"] = (_write(folder / "icon.ff", farbfeld), (wide >> 8).astype(float), 0)
    return files


@pytest.mark.parametrize("fmt", ["Radiance HDR", "PFM", "TIFF", "farbfeld"])
def test_formats_opencv_or_we_read_are_read(readable, fmt):
    path, expected, tolerance = readable[fmt]
    pixels = load_image(path)
    assert pixels.shape == (32, 48, 3) and pixels.dtype == np.uint8
    assert np.abs(pixels.astype(float) - expected).max() <= tolerance + 0.5


def _xcf() -> bytes:
    return b"gimp xcf v011\x00" + struct.pack(">III", 48, 32, 0) + bytes(64)


def _dicom() -> bytes:
    meta = b"\x02\x00\x10\x00UI\x14\x001.2.840.10008.1.2.1\x00"
    return bytes(128) + b"DICM" + meta


def _svgz() -> bytes:
    svg = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'
    return gzip.compress(svg)


NAMED = {  # file -> (format as named, what the message says would read it)
    "scanner-12bit.jpg": ("12-bit JPEG", "12-bit JPEG decoder"),
    "medical.jls": ("JPEG-LS", "CharLS"),
    "photo.jxr": ("JPEG XR", "jxrlib"),
    "photo.jxl": ("JPEG XL", "pillow-jxl-plugin"),
    "render.exr": ("OpenEXR", "OpenEXR"),
    "layers.xcf": ("XCF (GIMP)", "export it as PNG"),
    "slice.dcm": ("DICOM", "pydicom"),
    "logo.svgz": ("SVGZ (compressed SVG)", "raster images only"),
}


def test_formats_nothing_here_reads_are_named_with_what_would(tmp_path):
    built = {"layers.xcf": _xcf(), "slice.dcm": _dicom(), "logo.svgz": _svgz()}
    for name, (fmt, reader) in NAMED.items():
        path = _write(tmp_path / name, built[name]) if name in built else str(FIXTURES / name)
        with pytest.raises(ImageLoadError) as caught:
            load_image(path)
        message = str(caught.value)
        assert message.startswith(f"this server cannot read image {path} ({fmt}): it needs ")
        assert reader in message, message


def _avif(tmp_path: Path, width: int, height: int) -> str:
    """A real AVIF (OpenCV's libavif), its declared extents then set to width x height."""
    small = np.full((40, 60, 3), 90, np.uint8)
    ok, encoded = cv2.imencode(".avif", small)
    assert ok
    data = bytearray(encoded.tobytes())
    at = data.find(b"ispe") + 8
    data[at : at + 8] = struct.pack(">II", width, height)
    return _write(tmp_path / f"{width}x{height}.avif", bytes(data))


def _png_declaring(tmp_path: Path, width: int, height: int) -> str:
    """A PNG header declaring a canvas Pillow's decompression-bomb check refuses to open."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(bytes(1 + 3 * 64))  # a row's worth: Pillow opens before it decodes
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    return _write(tmp_path / "huge.png", data)


def test_the_size_limit_speaks_first_whatever_reads_the_file(tmp_path):
    """A 289 MP AVIF (libavif refuses it on its own terms) and a 400 MP PNG (Pillow's bomb
    check refuses to open it) get the store's size-limit message, as any large image does."""
    for path in (_avif(tmp_path, 17000, 17000), _png_declaring(tmp_path, 20000, 20000)):
        with pytest.raises(ImageLoadError, match=r"MP\); the limit is 64 MP"):
            load_image(path)
    # past a limit set above Pillow's own, Pillow's reason is given, cleanly
    with pytest.raises(ImageLoadError, match="decompression-bomb limit"):
        load_image(_png_declaring(tmp_path, 20000, 20000), ImagePolicy(max_pixels=10**9))


def test_corrupt_files_of_known_formats_say_so(tmp_path, readable):
    short = Path(readable["farbfeld"][0]).read_bytes()[:1000]
    with pytest.raises(ImageLoadError, match=r"\(farbfeld\) is corrupt or truncated"):
        load_image(_write(tmp_path / "short.ff", short))
    with pytest.raises(ImageLoadError, match=r"\(PFM\) is corrupt or truncated: its header"):
        load_image(_write(tmp_path / "nosize.pfm", b"PF\nwide high\n-1\n" + bytes(64)))
    with pytest.raises(ImageLoadError, match=r"OpenCV here did not decode it"):
        load_image(_write(tmp_path / "bad.hdr", b"#?RADIANCE\n\n-Y 32 +X 48\n" + bytes(10)))
    with pytest.raises(ImageLoadError, match=r"corrupt or truncated \(or not an image\)"):
        load_image(_write(tmp_path / "noise.bin", bytes(range(256)) * 4))


def _encoded(ext: str, rgb: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(ext, _bgr(rgb))
    assert ok, ext
    return encoded.tobytes()


def _pillow(fmt: str, size: tuple[int, int], **options) -> bytes:
    out = BytesIO()
    Image.new("L" if fmt == "GIF" else "RGB", size).save(out, fmt, **options)
    return out.getvalue()


def test_headers_declare_the_size_their_encoder_wrote():
    """Every format whose header declares a size gives it, from files real encoders wrote:
    imagesize's (PNG ... JPEG 2000, Netpbm) and ours (GIF, the formats only we name)."""
    from speceyes_tools.formats import declared_size

    eight = (np.random.default_rng(0).random((37, 53, 3)) * 255).astype(np.uint8)
    files = {ext: _encoded(ext, eight) for ext in (".png", ".jpg", ".bmp", ".webp", ".tif")}
    files |= {ext: _encoded(ext, eight) for ext in (".avif", ".jp2", ".ppm")}
    files |= {ext: _encoded(ext, (eight / 255.0).astype(np.float32)) for ext in (".hdr", ".pfm")}
    files["BigTIFF"] = _pillow("TIFF", (53, 37), big_tiff=True)
    files["lossless WebP"] = _pillow("WEBP", (53, 37), lossless=True)
    files["progressive JPEG"] = _pillow("JPEG", (53, 37), progressive=True)
    for name, data in files.items():
        assert declared_size(data) == (53, 37), name
    for name in ("scanner-12bit.jpg", "medical.jls", "render.exr"):
        assert declared_size((FIXTURES / name).read_bytes()) == (48, 32), name
    # a GIF side past 32767 (imagesize 2.0 reads GIF's unsigned sides as signed)
    assert declared_size(_pillow("GIF", (40000, 3))) == (40000, 3)


def test_a_crafted_header_is_walked_a_bounded_number_of_reads(monkeypatch):
    """imagesize walks a JPEG marker by marker to the end of the file: a file of empty
    segments is refused after the bound, not walked (seconds, for 64 MB)."""
    from speceyes_tools import formats

    reads = 0
    read = formats._HeaderReads.read

    def counted(self, size=-1):
        nonlocal reads
        reads += 1
        return read(self, size)

    monkeypatch.setattr(formats._HeaderReads, "read", counted)
    crafted = b"\xff\xd8" + b"\xff\xfe\x00\x02" * (1 << 20)  # 4 MB of empty comments
    assert formats.declared_size(crafted) is None
    assert reads < 10_000  # unbounded, the walk reads each of the million segments


def test_an_avif_under_a_heif_major_brand_is_named_avif():
    """An AVIF whose ftyp names ``mif1`` first and lists ``avif`` is AVIF (OpenCV reads it),
    not a HEIF needing pillow-heif."""
    from speceyes_tools.formats import identify

    data = bytearray(_encoded(".avif", np.full((40, 60, 3), 90, np.uint8)))
    assert data[8:12] == b"avif" and b"mif1" in data[16:32]
    data[8:12] = b"mif1"
    signature = identify(bytes(data))
    assert signature is not None
    assert (signature.format, signature.reader, signature.size) == ("AVIF", "opencv", (60, 40))
