"""What an image file is, from its first bytes, when Pillow cannot say.

Pillow identifies the formats it reads. Everything else used to leave one message, "corrupt
or truncated (or not an image)", which is wrong for a valid OpenEXR render, a 12-bit JPEG
from a scanner or a DICOM slice, and unhelpful for all of them. Here each common format is
recognised by its signature, so that a refusal names the format and what would read it, and
the formats OpenCV reads (Radiance HDR, PFM, float TIFF, AVIF, ... as this host's OpenCV was
built) are read.

The header's declared size is read too, without decoding (by :mod:`imagesize` for the
common formats, by us for the rest): a file over the store's pixel limit is refused with the
limit's message whatever reads it (a 289 MP AVIF that libavif refuses on its own terms, or a
PNG past Pillow's decompression-bomb check).

Signatures stay ours: where ``filetype`` 1.2 knows one of these formats its test is the same
one-line byte test, and it knows fewer (no farbfeld, Radiance, PFM, OpenEXR, JPEG XL, SVG,
BPG or KTX, no BigTIFF, HEIF under the ``heic`` brand only) or says less (JPEG for a 12-bit
or JPEG-LS file, gzip for SVGZ, PSD for PSB).

Samples are made 8-bit RGB by the codec's rule (:mod:`speceyes_tools.codec`): wide integers
by their high byte, floats as 0.0-1.0 — except scene-linear formats (Radiance HDR, OpenEXR),
which are shown as viewers show them, through the sRGB transfer curve.
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import imagesize
import numpy as np
from PIL import features

__all__ = ["Signature", "declared_size", "identify", "read_pixels"]

_SCAN = 1 << 16  # how far into a file a header is looked for


@dataclass(frozen=True)
class Signature:
    """A format recognised by its first bytes.

    ``reader`` is what reads it on this host (``"opencv"``, ``"farbfeld"``), or ``None``;
    ``needs`` says what would read it, for the refusal; ``size`` is (width, height) as the
    header declares it, when it could be parsed.
    """

    format: str
    size: tuple[int, int] | None
    reader: str | None
    needs: str
    linear: bool = False  # samples are scene-linear light (shown through the sRGB curve)
    document: bool = False  # a document (PDF), recognised to name it, not an image


# --- sizes, from the headers ------------------------------------------------------------------


def _u32(data: bytes, at: int, order: str = ">") -> int | None:
    if at + 4 > len(data):
        return None
    return int(struct.unpack(order + "I", data[at : at + 4])[0])


def _pair(w: int | None, h: int | None) -> tuple[int, int] | None:
    return (w, h) if w and h and w > 0 and h > 0 else None


def _radiance_size(data: bytes) -> tuple[int, int] | None:
    m = re.search(rb"\n\n([-+][XY]) (\d+) ([-+][XY]) (\d+)", data[:_SCAN])
    if m is None:
        return None
    first, second = int(m.group(2)), int(m.group(4))
    return _pair(second, first) if m.group(1).endswith(b"Y") else _pair(first, second)


def _pfm_size(data: bytes) -> tuple[int, int] | None:
    m = re.match(rb"P[Ff]\s+(\d+)\s+(\d+)", data[:64])
    return _pair(int(m.group(1)), int(m.group(2))) if m else None


def _exr_size(data: bytes) -> tuple[int, int] | None:
    """From the ``dataWindow`` attribute (box2i) of the header's attribute list."""
    pos = 8
    while pos < min(len(data), _SCAN):
        end = data.find(b"\0", pos)
        if end <= pos:  # the empty name ends the header
            return None
        name = data[pos:end]
        type_end = data.find(b"\0", end + 1)
        size = _u32(data, type_end + 1, "<") if type_end > 0 else None
        if size is None:
            return None
        value = type_end + 5
        if name == b"dataWindow" and size == 16 and value + 16 <= len(data):
            x0, y0, x1, y1 = struct.unpack("<4i", data[value : value + 16])
            return _pair(x1 - x0 + 1, y1 - y0 + 1)
        pos = value + size
    return None


def _jpeg_frame(data: bytes) -> tuple[int, int, int, int] | None:
    """(marker, precision, height, width) of the first frame header, walking the segments."""
    pos = 2
    while pos + 4 <= min(len(data), _SCAN):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if (marker in _SOF or marker == 0xF7) and pos + 9 <= len(data):  # SOFn, SOF55 (JPEG-LS)
            precision, height, width = struct.unpack(">BHH", data[pos + 4 : pos + 9])
            return marker, precision, height, width
        pos += 2 + length
    return None


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    frame = _jpeg_frame(data)
    return _pair(frame[3], frame[2]) if frame else None


class _HeaderReads:
    """The bytes as the file :mod:`imagesize` reads, refused after a few thousand reads.

    imagesize walks a JPEG marker by marker and an ISO file box by box, to the end of the
    file if need be: seconds for a crafted file of empty segments. A real header ends within
    a few dozen reads. Reads are slices of the caller's bytes (no copy of the file).
    """

    _READS = 4096

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._at = 0
        self._left = self._READS

    def read(self, size: int = -1) -> bytes:
        self._left -= 1
        if self._left < 0:
            raise ValueError("a header walk past its bound")
        end = self._at + (_SCAN if size < 0 else size)
        chunk = self._view[self._at : end].tobytes()
        self._at += len(chunk)
        return chunk

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: len(self._view)}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at


def declared_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) as the header of a common format declares it, without decoding: for
    files Pillow refuses before saying (its decompression-bomb check), so the store can give
    its own size limit's message.

    :mod:`imagesize` reads PNG, JPEG, GIF, BMP, WebP, TIFF, JPEG 2000, Netpbm, HEIF and
    AVIF (the primary item's extents); the rest are ours: GIF (imagesize 2.0 reads its
    unsigned sides as signed, so a 40000-pixel side comes back negative), PSD, and the
    formats :func:`identify` names. A big-endian BigTIFF declares no size here (imagesize
    reads the little-endian kind only).
    """
    if data.startswith(b"GIF8") and len(data) >= 10:
        return _pair(*struct.unpack("<HH", data[6:10]))
    if data.startswith(b"8BPS") and len(data) >= 22:
        h, w = struct.unpack(">II", data[14:22])
        return _pair(w, h)
    signature = identify(data)
    return signature.size if signature is not None else _imagesize(data)


def _imagesize(data: bytes) -> tuple[int, int] | None:
    if data.startswith(b"<"):  # never imagesize's SVG parser: we read raster images only
        return None
    return _pair(*imagesize.get(_HeaderReads(data), exif_rotation=False))  # (-1, -1): unread


# --- signatures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    format: str
    test: Callable[[bytes], bool]
    needs: str
    size: Callable[[bytes], tuple[int, int] | None] = lambda data: None
    reader: str | None = None
    linear: bool = False
    document: bool = False


_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"}


def _brands(data: bytes) -> set[bytes]:
    """The major and compatible brands of an ISO file's ``ftyp`` box (none without one)."""
    if data[4:8] != b"ftyp":
        return set()
    end = min(int.from_bytes(data[:4], "big"), len(data), 256)
    return {data[8:12]} | {data[at : at + 4] for at in range(16, end - 3, 4)}


def _svgz(data: bytes) -> bool:
    """A gzip stream whose first 4 KB, inflated (no more), hold an ``<svg`` tag."""
    if not data.startswith(b"\x1f\x8b"):
        return False
    try:
        head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[:_SCAN], 4096)
    except zlib.error:
        return False
    return b"<svg" in head.lower()


def _jpeg_precision(data: bytes, wanted: Callable[[int, int], bool]) -> bool:
    frame = _jpeg_frame(data) if data.startswith(b"\xff\xd8") else None
    return frame is not None and wanted(frame[0], frame[1])


_FLOAT = "floating-point samples"
_KINDS = [
    _Kind(
        "farbfeld",
        lambda d: d.startswith(b"farbfeld"),
        "a farbfeld reader",
        lambda d: _pair(_u32(d, 8), _u32(d, 12)),
        "farbfeld",
    ),
    _Kind(
        "Radiance HDR",
        lambda d: d.startswith((b"#?RADIANCE", b"#?RGBE")),
        "OpenCV's HDR codec",
        _radiance_size,
        "opencv",
        linear=True,
    ),
    _Kind(
        "PFM",
        lambda d: re.match(rb"P[Ff]\s", d[:3]) is not None,
        "OpenCV's PFM codec",
        _pfm_size,
        "opencv",
    ),  # fmt: skip
    _Kind(
        "OpenEXR",
        lambda d: d.startswith(b"v/1\x01"),
        "OpenCV built with OpenEXR (and OPENCV_IO_ENABLE_OPENEXR=1), or the OpenEXR package",
        _exr_size,
        "opencv",
        linear=True,
    ),
    _Kind(
        "TIFF",  # a variant Pillow cannot read: float RGB, 32-bit integer RGB, ...
        lambda d: d[:4] in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"),
        "a TIFF reader for this variant, such as tifffile",
        _imagesize,
        "opencv",
    ),
    _Kind(
        "lossless JPEG",
        lambda d: _jpeg_precision(d, lambda m, p: m in (0xC3, 0xC7, 0xCB, 0xCF)),
        "a lossless-JPEG decoder (e.g. the imagecodecs package)",
        _jpeg_size,
    ),
    _Kind(
        "12-bit JPEG",
        lambda d: _jpeg_precision(d, lambda m, p: m != 0xF7 and p == 12),
        "a 12-bit JPEG decoder (libjpeg-turbo 3 or later, e.g. in the imagecodecs package)",
        _jpeg_size,
        "opencv",
    ),
    _Kind(
        "JPEG-LS",
        lambda d: _jpeg_precision(d, lambda m, p: m == 0xF7),
        "a JPEG-LS decoder (CharLS, e.g. in the imagecodecs package)",
        _jpeg_size,
    ),
    _Kind(
        "JPEG XR",
        lambda d: d.startswith(b"II\xbc"),
        "a JPEG XR decoder (jxrlib, e.g. in the imagecodecs package)",
    ),
    _Kind(
        "JPEG XL",
        lambda d: d.startswith(b"\xff\x0a") or d.startswith(b"\x00\x00\x00\x0cJXL \r\n\x87\n"),
        "a JPEG XL decoder (a Pillow plugin such as pillow-jxl-plugin)",
    ),
    _Kind(
        "AVIF",  # before HEIF: an AVIF may carry a HEIF major brand (mif1) and list avif
        lambda d: bool(_brands(d) & {b"avif", b"avis"}),
        "Pillow built with AVIF, or OpenCV built with libavif",
        _imagesize,
        "opencv",
    ),
    _Kind(
        "HEIF",
        lambda d: bool(_brands(d) & _HEIF_BRANDS),
        "a HEIF decoder (the pillow-heif plugin)",
        _imagesize,
    ),
    _Kind(
        "JPEG 2000",
        lambda d: (
            d.startswith(b"\x00\x00\x00\x0cjP  \r\n\x87\n") or d.startswith(b"\xff\x4f\xff\x51")
        ),
        "Pillow or OpenCV built with OpenJPEG",
        _imagesize,  # the JP2 box format's; a bare codestream declares none here
        "opencv",
    ),
    _Kind(
        "WebP",
        lambda d: d[:4] == b"RIFF" and d[8:12] == b"WEBP",
        "Pillow or OpenCV built with libwebp",
        _imagesize,
        "opencv",
    ),
    _Kind(
        "SVG",
        lambda d: b"<svg" in d[:4096].lower(),
        "a vector renderer; this server reads raster images only (send it as PNG)",
    ),
    _Kind(
        "SVGZ (compressed SVG)",
        _svgz,
        "a vector renderer; this server reads raster images only (send it as PNG)",
    ),
    _Kind(
        "PDF",
        lambda d: d.startswith(b"%PDF"),
        "a document renderer (send its pages as images)",
        document=True,
    ),
    _Kind(
        "XCF (GIMP)",
        lambda d: d.startswith(b"gimp xcf "),
        "GIMP (it is GIMP's working file: export it as PNG)",
        lambda d: _pair(_u32(d, 14), _u32(d, 18)),
    ),
    _Kind(
        "Photoshop PSB",
        lambda d: d.startswith(b"8BPS\x00\x02"),
        "Photoshop (Pillow reads PSD, not the large-document PSB: export it as PNG)",
        lambda d: _pair(_u32(d, 18), _u32(d, 14)),
    ),
    _Kind(
        "DICOM",
        lambda d: d[128:132] == b"DICM",
        "a DICOM reader such as pydicom (medical images carry windowing this server does not apply)",
    ),
    _Kind(
        "camera raw",
        lambda d: (
            (d[4:8] == b"ftyp" and d[8:12] == b"crx ")
            or d.startswith((b"FUJIFILMCCD-RAW", b"IIRO", b"IIU\0"))
        ),
        "a raw developer such as rawpy (LibRaw)",
    ),
    _Kind("BPG", lambda d: d.startswith(b"BPG\xfb"), "a BPG decoder (libbpg)"),
    _Kind(
        "KTX texture",
        lambda d: d.startswith((b"\xabKTX 11\xbb\r\n\x1a\n", b"\xabKTX 20\xbb\r\n\x1a\n")),
        "a GPU-texture tool (KTX-Software); send the image as PNG",
    ),
]


def identify(data: bytes) -> Signature | None:
    """The format of bytes Pillow could not identify, or None for bytes of no known format.

    Pillow's optional codecs (AVIF, JPEG 2000, WebP) come here only when Pillow failed on
    the file: then OpenCV is tried, and a failure there names both.
    """
    for kind in _KINDS:
        if kind.test(data):
            reader = kind.reader
            needs = kind.needs
            if kind.format in ("AVIF", "JPEG 2000", "WebP") and features.check(
                {"AVIF": "avif", "JPEG 2000": "jpg_2000", "WebP": "webp"}[kind.format]
            ):
                needs = "Pillow and OpenCV both failed on it, so it is corrupt or a variant neither reads"
            return Signature(kind.format, kind.size(data), reader, needs, kind.linear, kind.document)
    return None


# --- pixels -----------------------------------------------------------------------------------


def read_pixels(data: bytes, signature: Signature) -> np.ndarray | None:
    """Upright 8-bit RGB pixels of a recognised format, or None when this host's reader for
    it (OpenCV as built here) could not decode them."""
    if signature.reader == "farbfeld":
        return _farbfeld(data, signature)
    if signature.reader != "opencv":
        return None
    import cv2

    flags = cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR | cv2.IMREAD_IGNORE_ORIENTATION
    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error:  # OpenCV 4 raises for a codec built in but disabled (OpenEXR); 5 says None
        return None
    if arr is None:
        return None
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr = arr[..., :3]
    if arr.ndim == 3:
        arr = arr[..., ::-1]  # OpenCV's BGR
    return _eight_bit_rgb(arr, signature.linear)


def _farbfeld(data: bytes, signature: Signature) -> np.ndarray | None:
    """16-byte header, then big-endian 16-bit RGBA rows: the high bytes, alpha dropped."""
    if signature.size is None:
        return None
    w, h = signature.size
    if len(data) < 16 + w * h * 8:
        return None
    rgba = np.frombuffer(data, np.uint8, count=w * h * 8, offset=16).reshape(h, w, 4, 2)
    return np.ascontiguousarray(rgba[:, :, :3, 0])  # the high byte of each sample


def _eight_bit_rgb(arr: np.ndarray, linear: bool) -> np.ndarray:
    if arr.dtype.kind == "f":
        values = np.clip(np.nan_to_num(arr.astype(np.float32)), 0.0, 1.0)
        if linear:  # the sRGB transfer curve
            values = np.where(
                values <= 0.0031308, 12.92 * values, 1.055 * np.power(values, 1 / 2.4) - 0.055
            )
        arr = (values * 255 + 0.5).astype(np.uint8)
    elif arr.dtype != np.uint8:
        shift = 8 * (arr.dtype.itemsize - 1)
        arr = (arr.astype(np.uint64) >> shift).astype(np.uint8) if shift else arr.astype(np.uint8)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    return np.ascontiguousarray(arr)
