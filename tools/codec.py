"""Encoded image bytes to the pixels a viewer shows, and back.

Every path that turns bytes into pixels comes here (the image store, hence the tools' frame,
the judge, the draft and the agent; the code sandbox's output images), so they all see the
same picture. The rule, for every format Pillow reads:

- **the first frame** (frame 0 of a GIF, animated PNG or WebP, multi-page TIFF, MPO, icon);
- **upright**: the EXIF orientation (JPEG, PNG, WebP, AVIF ...), TIFF's orientation tag or
  XMP's ``tiff:Orientation`` is applied as :func:`PIL.ImageOps.exif_transpose` does, once;
- **8-bit RGB**: samples wider than 8 bits are scaled by their declared bit depth (the high
  byte of a 16-bit sample, as browsers, OpenCV and Pillow's own 16-bit RGB do; Pillow's
  16-bit *grey* conversion clips at 255 instead, which turns a full-range scan white),
  floating-point samples are read as 0.0-1.0, alpha is dropped (not composited).

The header is read first, without decoding pixels (:func:`read_header`): size, orientation
and the memory a decode will take (:attr:`ImageHeader.decode_bytes`, per format and mode),
so a store can refuse or wait *before* anything is allocated. Plain PNG and JPEG go straight
into one NumPy buffer with OpenCV (Pillow peaks at about three frames for an 8K decode);
everything else through Pillow. Every failure, whatever the decoder raised, is an
:class:`~speceyes_tools.sources.ImageLoadError` naming the image and the cause; a codec
this host lacks (HEIF, JPEG XL, EPS without Ghostscript, WMF, GRIB ...) is named as such, and
formats Pillow does not read at all are recognised by their signature
(:mod:`speceyes_tools.formats`): named with what would read them, and read where OpenCV can.
"""

from __future__ import annotations

import base64
import io
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageFile

from .formats import Signature, declared_size, identify, read_pixels
from .sources import ImageLoadError

__all__ = [
    "ImageHeader",
    "decode_image",
    "encode_image",
    "encode_png",
    "thumbnail",
    "exif_orientation",
    "read_header",
    "sniff_mime",
    "upright",
]

_ORIENTATION_TAG = 0x0112
_BITS_PER_SAMPLE_TAG = 258

# EXIF orientation -> the array operation that shows the pixels as viewers do (the same
# operations as PIL's ImageOps.exif_transpose; rows are y, columns x)
_UPRIGHT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda a: a[:, ::-1],  # mirrored left-right
    3: lambda a: a[::-1, ::-1],  # upside down
    4: lambda a: a[::-1],  # mirrored top-bottom
    5: lambda a: a.swapaxes(0, 1),  # transposed
    6: lambda a: np.rot90(a, -1),  # a phone held upright: turn 90 degrees clockwise
    7: lambda a: a[::-1, ::-1].swapaxes(0, 1),  # transversed
    8: lambda a: np.rot90(a, 1),  # turn 90 degrees counter-clockwise
}

# --- encoding -------------------------------------------------------------------------------


def encode_png(arr: np.ndarray) -> bytes:
    """Lossless PNG bytes of an RGB array (fast compression: these are transient)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def encode_image(arr: np.ndarray, fmt: str = "PNG", quality: int = 92) -> str:
    """Encode an RGB array as a base64 string (PNG is lossless; JPEG is smaller)."""
    if fmt.upper() != "JPEG":
        return base64.b64encode(encode_png(arr)).decode("ascii")
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="JPEG", quality=quality)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def thumbnail(arr: np.ndarray, longest: int = 64, quality: int = 75) -> str:
    """A small JPEG of an RGB array, base64: what a chat message keeps so the person still
    sees the picture they sent (a few KB; the image itself stays in the store). Area
    resampling straight from the array: no full-size copy."""
    import cv2

    h, w = arr.shape[:2]
    scale = min(1.0, longest / max(h, w, 1))
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    small = cv2.resize(arr, size, interpolation=cv2.INTER_AREA) if scale < 1 else arr
    return encode_image(small, "JPEG", quality)


_MAGIC = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"BM", "image/bmp"),
]


def sniff_mime(data: bytes) -> str:
    """The MIME type of encoded image bytes, from their first bytes."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


# --- the header -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageHeader:
    """What the header says, before any pixel is decoded.

    ``width`` x ``height`` is the canvas as declared (turned or not: only its area is used
    before the decode); ``decode_bytes`` bounds the memory a decode allocates, counted per
    format and mode from the declared size, so a 600-byte file that declares 50 megapixels is
    priced at what decoding it costs, not at its file size.
    """

    format: str
    mode: str
    width: int
    height: int
    orientation: int
    bits: int
    decode_bytes: int
    # set for a format Pillow cannot read (:mod:`speceyes_tools.formats`): what reads it here
    # (``"opencv"``, ``"farbfeld"``) and, when nothing does, the refusal that names what would
    reader: str = "pillow"
    refusal: str | None = None

    @property
    def pixels(self) -> int:
        return self.width * self.height


def _png_chunk(data: bytes, kind: bytes, before_pixels: bool = False) -> bytes | None:
    """The first chunk of ``kind`` in PNG bytes, found by walking the chunk lengths (no
    decompression): Pillow reads an eXIf chunk after the image data only by decoding."""
    pos = 8
    while pos + 8 <= len(data):
        length, tag = struct.unpack(">I4s", data[pos : pos + 8])
        if tag == kind:
            return data[pos + 8 : pos + 8 + length]
        if tag == b"IEND" or (before_pixels and tag == b"IDAT"):
            return None
        pos += 12 + length
    return None


def _orientation(im: Image.Image, data: bytes | None) -> int:
    """The orientation (1-8) Pillow's exif_transpose would apply, read without a decode."""
    try:
        if im.format == "PNG" and "exif" not in im.info:
            # Pillow's PNG getexif() decodes the whole image to look past the pixel data
            raw = _png_chunk(data, b"eXIf") if data is not None else None
            profile = im.info.get("Raw profile type exif")  # ImageMagick writes EXIF as text
            if raw is None and isinstance(profile, str):
                raw = bytes.fromhex("".join(profile.split("\n")[3:]))
            im.info["exif"] = raw or b""  # found or not, getexif() now needs no decode
        value = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a malformed EXIF block: the pixels are still an image, shown as stored
        return 1
    return value if value in _UPRIGHT else 1


def _declared_bits(im: Image.Image) -> int:
    """Bits per sample as declared (TIFF's BitsPerSample; 16 for Pillow's 16-bit modes)."""
    if im.mode.startswith("I;16") or im.mode == "I":
        tags = getattr(im, "tag_v2", None)
        declared = tags.get(_BITS_PER_SAMPLE_TAG) if tags is not None else None
        if isinstance(declared, tuple):
            declared = declared[0] if declared else None
        if isinstance(declared, int) and 8 < declared <= 32:
            return declared
        return 16
    return 32 if im.mode == "F" else 8


# Bytes per pixel of Pillow's own storage of a mode (multi-band modes take four bytes)
_PIL_BYTES = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}
_DECODER_STATE = 8 << 20  # row buffers, tables and the like, whatever the size
# Decoders that hold a whole image of their own besides Pillow's (bytes per pixel)
_DECODER_BYTES = {
    "JPEG2000": 16,
    "WEBP": 6,
    "AVIF": 8,
    "BLP": 8,
    "DDS": 4,
    "PSD": 4,
    "ICNS": 8,
    "FITS": 8,
    "SPIDER": 4,
}


# Containers whose pixels come from an embedded JPEG or PNG with a canvas of its own, which
# the container's header does not bound (a 3 KB BLP declares 425x256 and embeds a JPEG of
# 64512x256: 221 MB to decode)
_CONTAINERS = {"BLP", "ICNS", "ICO", "CUR"}


def _embedded_pixels(data: bytes) -> int:
    """The largest canvas a JPEG frame header or PNG IHDR inside ``data`` declares (segment
    lengths checked, so stray bytes in compressed data are not read as one)."""
    largest = 0
    for m in re.finditer(rb"\xff[\xc0-\xc3]", data):
        i = m.start()
        if i + 10 > len(data):
            break
        length, precision, height, width, components = struct.unpack(">HBHHB", data[i + 2 : i + 10])
        if precision in (8, 12) and components in (1, 3, 4) and length == 8 + 3 * components:
            largest = max(largest, width * height * components)
    for m in re.finditer(rb"\x00\x00\x00\x0dIHDR", data):
        i = m.end()
        if i + 8 <= len(data):
            width, height = struct.unpack(">II", data[i : i + 8])
            largest = max(largest, width * height * 4)
    return largest


def _uses_opencv(im: Image.Image, data: bytes | None) -> bool:
    """Plain PNG and RGB or grey JPEG: OpenCV decodes these into a single buffer. Animated
    PNGs (OpenCV shows the first animation frame, Pillow and browsers without APNG the
    default image, which may differ) and CMYK JPEGs (OpenCV converts CMYK its own way) go
    through Pillow, so every path shows the same picture."""
    if im.format == "PNG":
        return data is not None and _png_chunk(data, b"acTL", before_pixels=True) is None
    return im.format == "JPEG" and im.mode in ("RGB", "L")


def _decode_cost(im: Image.Image, orientation: int, data: bytes | None) -> int:
    """Peak bytes a decode of ``im`` allocates, from its declared size and mode (measured per
    format by ``tests/decode_capped.py --measure``; the price must never undercount)."""
    if _uses_opencv(im, data):
        # OpenCV's frame and the one it is returned in; turning reuses them
        return _DECODER_STATE + im.size[0] * im.size[1] * 6
    return _pillow_cost(im, orientation, data)


def _pillow_cost(im: Image.Image, orientation: int, data: bytes | None) -> int:
    native = _PIL_BYTES.get(im.mode, 4)
    if im.format == "TIFF" and orientation != 1:
        native *= 2  # Pillow turns TIFFs upright itself, into a second image
    decoder = _DECODER_BYTES.get(im.format or "", 0)
    embedded = _embedded_pixels(data) * 4 if im.format in _CONTAINERS and data else 0
    # Pillow's image, its RGB conversion (4 bytes a pixel inside Pillow), then the array (3)
    # and the bytes it is copied through (3); the upright copy comes after the conversion
    pixels = im.size[0] * im.size[1]
    return _DECODER_STATE + pixels * (native + decoder + 4 + 6) + embedded


def _missing_decoder(im: Image.Image, name: str) -> ImageLoadError | None:
    """A format Pillow identifies but this host cannot decode, named with what it lacks."""
    fmt = im.format or "this format"
    if fmt == "EPS":
        from PIL import EpsImagePlugin

        if not EpsImagePlugin.has_ghostscript():
            return ImageLoadError(
                f"this server cannot read image {name} (EPS): Ghostscript is not installed"
            )
    if isinstance(im, ImageFile.StubImageFile):  # needs a handler the application registers
        why = (
            "Pillow renders them only on Windows"
            if fmt == "WMF"
            else "Pillow reads only the header of them"
        )
        return ImageLoadError(f"this server cannot read image {name} ({fmt}): {why}")
    return None


def read_header(data: bytes, name: str = "image") -> ImageHeader:
    """The header of encoded bytes (no pixels decoded), or :class:`ImageLoadError`."""
    try:
        with warnings.catch_warnings():  # our own pixel cap decides, right after this
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                return _header_of(im, data)
    except Exception as exc:
        if isinstance(exc, Image.DecompressionBombError):
            size = declared_size(data)  # the caller's pixel limit speaks first, if lower
            if size is not None:
                return _refused(size, _failure(exc, name, None))
        if isinstance(exc, Image.UnidentifiedImageError):
            signature = identify(data)
            if signature is not None:
                return _signature_header(signature, name)
        raise _failure(exc, name, None) from None


def _refused(size: tuple[int, int], error: ImageLoadError, fmt: str = "?") -> ImageHeader:
    """The header of a file that will be refused once its size has passed the caller's
    limit: that limit's message is the more useful one when both apply."""
    return ImageHeader(fmt, "?", size[0], size[1], 1, 8, 0, reader="", refusal=str(error))


def _signature_header(signature: Signature, name: str) -> ImageHeader:
    """A format Pillow cannot read: priced for its reader here, or refused naming what would
    read it (after the size check, when the header declares a size)."""
    fmt = signature.format
    if signature.reader is None or signature.size is None:
        why = (
            f"this server cannot read image {name} ({fmt}): it needs {signature.needs}"
            if signature.reader is None
            else f"image {name} ({fmt}) is corrupt or truncated: its header declares no size"
        )
        if signature.size is None:
            raise ImageLoadError(why)
        return _refused(signature.size, ImageLoadError(why), fmt)
    w, h = signature.size
    # the decoder's frame in up to four float32 channels, its 8-bit conversions and the copy
    decode_bytes = _DECODER_STATE + w * h * (16 + 16 + 6)
    return ImageHeader(fmt, "?", w, h, 1, 8, decode_bytes, reader=signature.reader)


def _header_of(im: Image.Image, data: bytes | None) -> ImageHeader:
    orientation = _orientation(im, data)
    return ImageHeader(
        format=im.format or "?",
        mode=im.mode,
        width=im.size[0],
        height=im.size[1],
        orientation=orientation,
        bits=_declared_bits(im),
        decode_bytes=_decode_cost(im, orientation, data),
    )


def exif_orientation(source: bytes | BinaryIO) -> int:
    """The orientation (1-8) of encoded image bytes or an open binary file, from the header
    only; 1 (as stored) when there is none or it cannot be read."""
    try:
        data = source if isinstance(source, bytes) else None
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
            if data is None and im.format == "PNG" and "exif" not in im.info:
                source.seek(0)  # type: ignore[union-attr]
                data = source.read()  # type: ignore[union-attr]
            return _orientation(im, data)
    except Exception:
        return 1


def upright(arr: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels as viewers show them: ``arr`` (as stored) turned by its orientation.

    8-bit images turn in OpenCV (a vectorised copy; numpy's strided copy of a quarter turn
    costs a good share of decoding the PNG: docs/throughput.md); anything else in numpy."""
    turn = _UPRIGHT.get(orientation)
    if turn is None:
        return arr
    if arr.dtype == np.uint8 and (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        import cv2

        flip, rotate = cv2.flip, cv2.rotate
        cv_turns: dict[int, Callable[[np.ndarray], np.ndarray]] = {
            2: lambda a: flip(a, 1),
            3: lambda a: rotate(a, cv2.ROTATE_180),
            4: lambda a: flip(a, 0),
            5: cv2.transpose,
            6: lambda a: rotate(a, cv2.ROTATE_90_CLOCKWISE),
            7: lambda a: cv2.transpose(rotate(a, cv2.ROTATE_180)),
            8: lambda a: rotate(a, cv2.ROTATE_90_COUNTERCLOCKWISE),
        }
        return np.asarray(cv_turns[orientation](np.ascontiguousarray(arr)))
    return np.ascontiguousarray(turn(arr))


# --- decoding -------------------------------------------------------------------------------


def _reason(exc: BaseException) -> str:
    """The decoder's message without the repr of the buffer it read (an address, different
    every run); the exception's type when it has no message."""
    text = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(exc)).strip()
    return text or type(exc).__name__


def _failure(exc: Exception, name: str, header: ImageHeader | None) -> ImageLoadError:
    """Whatever a decoder raised, as an ImageLoadError that names the image and the cause."""
    fmt = f" ({header.format})" if header else ""
    if isinstance(exc, ImageLoadError):
        return exc
    if isinstance(exc, MemoryError):
        need = (
            f" ({header.format}, {header.width}x{header.height}, about "
            f"{header.decode_bytes / 2**20:.0f} MiB)"
            if header
            else ""
        )
        return ImageLoadError(f"out of memory decoding image {name}{need}")
    if isinstance(exc, Image.DecompressionBombError):
        return ImageLoadError(
            f"image {name}{fmt} is larger than PIL's decompression-bomb limit "
            f"({Image.MAX_IMAGE_PIXELS} pixels); raise PIL.Image.MAX_IMAGE_PIXELS only for "
            "trusted data"
        )
    missing = re.search(r"decoder (\w+) not available", str(exc))
    if missing:
        return ImageLoadError(
            f"this server cannot read image {name}{fmt}: Pillow was built without the "
            f"{missing.group(1)} decoder"
        )
    if isinstance(exc, NotImplementedError):
        return ImageLoadError(
            f"image {name}{fmt} uses a variant this server cannot decode: {_reason(exc)}"
        )
    if header is None and isinstance(exc, Image.UnidentifiedImageError):
        return ImageLoadError(
            f"image {name} is corrupt or truncated (or not an image): {_reason(exc)}"
        )
    if isinstance(exc, (OSError, SyntaxError, ValueError, EOFError, struct.error)):
        return ImageLoadError(f"image {name}{fmt} is corrupt or truncated: {_reason(exc)}")
    return ImageLoadError(
        f"image {name}{fmt} could not be decoded ({type(exc).__name__}: {_reason(exc)})"
    )


def _to_rgb(im: Image.Image, bits: int) -> np.ndarray:
    """Pillow's frame as 8-bit RGB by the module's rule (wide samples by declared depth)."""
    if im.mode == "RGB":
        return np.asarray(im)
    if im.mode.startswith("I"):
        wide = np.asarray(im)
        grey = (np.clip(wide, 0, (1 << bits) - 1) >> (bits - 8)).astype(np.uint8)
    elif im.mode == "F":
        grey = (np.clip(np.nan_to_num(np.asarray(im)), 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
    else:
        return np.asarray(im.convert("RGB"))
    return np.repeat(grey[..., None], 3, axis=2)


def _decode_with_opencv(data: bytes) -> np.ndarray | None:
    import cv2

    # orientation is applied by the caller, the same way for every format
    arr = cv2.imdecode(
        np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION
    )
    if arr is None:
        return None
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB, dst=arr)  # in place


def decode_image(
    data: bytes,
    name: str = "image",
    max_pixels: int | None = None,
    header: ImageHeader | None = None,
) -> np.ndarray:
    """Encoded bytes -> upright RGB ``uint8`` array ``[H, W, 3]`` by the module's rule,
    refusing images over ``max_pixels`` before decoding. Truncated files are reported, never
    decoded to grey rows. Pass the ``header`` already read to skip reading it again."""
    header = header or read_header(data, name)
    if max_pixels is not None and header.pixels > max_pixels:
        raise ImageLoadError(
            f"image {name} is {header.width}x{header.height} ({header.pixels / 1e6:.1f} MP); "
            f"the limit is {max_pixels / 1e6:.0f} MP"
        )
    if header.refusal is not None:
        raise ImageLoadError(header.refusal)
    if header.reader != "pillow":
        return _read_signature(data, name, header)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                missing = _missing_decoder(im, name)
                if missing is not None:
                    raise missing
                if _uses_opencv(im, data):
                    arr = _decode_with_opencv(data)
                    if arr is not None:
                        return upright(arr, header.orientation)
                    # OpenCV refuses some files Pillow reads as viewers do (an APNG whose
                    # animation is broken shows its default image): Pillow decides, within
                    # the price (a little over, for a small file)
                    if _pillow_cost(im, 1, None) > header.decode_bytes + (32 << 20):
                        raise ImageLoadError(
                            f"image {name} ({header.format}) is corrupt or truncated (OpenCV "
                            "cannot decode it)"
                        )
                im.load()  # raises on truncated data
                # Pillow turns a TIFF upright while loading it and drops the tag: turn only
                # what is left
                left = _orientation(im, None) if im.format == "TIFF" else header.orientation
                return upright(_to_rgb(im, header.bits), left)
    except Exception as exc:
        raise _failure(exc, name, header) from None


def _read_signature(data: bytes, name: str, header: ImageHeader) -> np.ndarray:
    signature = identify(data)
    arr = read_pixels(data, signature) if signature is not None else None
    if arr is None and header.reader != "opencv":  # a reader of our own: the bytes are short
        raise ImageLoadError(f"image {name} ({header.format}) is corrupt or truncated")
    if arr is None or signature is None:
        needs = signature.needs if signature is not None else "a decoder"
        raise ImageLoadError(
            f"this server cannot read image {name} ({header.format}): it needs {needs} "
            "(OpenCV here did not decode it: a variant its build lacks, or a damaged file)"
        )
    if arr.shape[:2] != (header.height, header.width):  # the price was for the declared size
        raise ImageLoadError(
            f"image {name} ({header.format}) is corrupt: its header declares "
            f"{header.width}x{header.height}, its pixels are {arr.shape[1]}x{arr.shape[0]}"
        )
    return arr
