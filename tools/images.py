"""Image references, decoding once per query, and the resize the model sees.

Graph state carries *references* (a path, a ``file://`` or ``data:`` URL, an ``http(s)``
URL, or a ``mem://`` key for bytes registered with :func:`put_bytes`) so that checkpoints
never hold pixel copies. :class:`ImageStore` decodes a reference once and keeps the
decoded RGB array in a small LRU bounded by bytes, so the judge, the speculator and every
tool step of one query share one decode of a 4K/8K image.

PIL's decompression-bomb guard stays on; corrupt, truncated or oversized images raise
:class:`ImageLoadError` with the reference in the message, which the graph records as
that query's error.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import threading
import urllib.parse
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = [
    "ImageLoadError",
    "ImageStore",
    "ResizeSpec",
    "default_store",
    "encode_image",
    "load_image",
    "put_bytes",
    "release",
    "smart_resize",
]


class ImageLoadError(RuntimeError):
    """An image reference could not be turned into pixels."""


@dataclass(frozen=True)
class ResizeSpec:
    """How a Qwen-VL processor resizes an image before the model sees it.

    ``factor`` is patch size x spatial merge (28 for Qwen2.5-VL, 32 for Qwen3-VL). The
    defaults match vLLM-style deployments of Qwen2.5-VL (``max_pixels = 1280 * 28 * 28``);
    set them to your processor's values so model-space boxes map back exactly.
    """

    factor: int = 28
    min_pixels: int = 56 * 56
    max_pixels: int = 1280 * 28 * 28

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the image as the model sees it."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return w, h


def smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 14 * 14 * 4 * 1280,
) -> tuple[int, int]:
    """Qwen-VL's resize rule: sides multiples of ``factor``, pixel count within bounds.

    Returns ``(height, width)``, the order the Qwen processors use.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image sides must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"aspect ratio must be below 200, got {max(height, width) / min(height, width):.1f}"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# --- decoding ----------------------------------------------------------------------------

_MEM: dict[str, bytes] = {}
_MEM_LOCK = threading.Lock()


def put_bytes(data: bytes) -> str:
    """Register encoded image bytes in this process and return a ``mem://`` reference."""
    key = "mem://" + hashlib.sha1(data).hexdigest()
    with _MEM_LOCK:
        _MEM[key] = data
    return key


def release(ref: str) -> None:
    """Forget a ``mem://`` image and its decoded copies (benchmark runners stream thousands)."""
    with _MEM_LOCK:
        _MEM.pop(ref, None)
    _DEFAULT_STORE.forget(ref)


def _read_bytes(ref: str) -> bytes:
    if ref.startswith("mem://"):
        with _MEM_LOCK:
            if ref not in _MEM:
                raise ImageLoadError(
                    f"unknown in-memory image {ref!r} (register it with put_bytes)"
                )
            return _MEM[ref]
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            return urllib.parse.unquote_to_bytes(payload)
        try:
            return base64.b64decode(payload, validate=False)
        except ValueError as exc:
            raise ImageLoadError(f"bad base64 in data URL: {exc}") from exc
    if ref.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(ref, timeout=30) as resp:  # noqa: S310 - user-given URL
                return resp.read()
        except OSError as exc:
            raise ImageLoadError(f"could not fetch {ref}: {exc}") from exc
    path = Path(urllib.parse.urlparse(ref).path if ref.startswith("file://") else ref)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ImageLoadError(
            f"could not read image file {str(path)!r}: {exc.strerror or exc}"
        ) from exc


def _open(ref: str) -> Image.Image:
    """Open lazily: files are streamed from disk, not read into a second buffer first."""
    if ref.startswith(("mem://", "data:", "http://", "https://")):
        return Image.open(io.BytesIO(_read_bytes(ref)))
    path = Path(urllib.parse.urlparse(ref).path if ref.startswith("file://") else ref)
    try:
        return Image.open(path)
    except FileNotFoundError as exc:
        raise ImageLoadError(
            f"could not read image file {str(path)!r}: {exc.strerror or exc}"
        ) from exc
    except IsADirectoryError as exc:
        raise ImageLoadError(f"could not read image file {str(path)!r}: is a directory") from exc


def load_image(ref: str) -> np.ndarray:
    """Decode a reference into an RGB ``uint8`` array of shape ``[H, W, 3]``."""
    if not isinstance(ref, str) or not ref:
        raise ImageLoadError(f"an image reference must be a non-empty string, got {ref!r}")
    short = ref if len(ref) < 80 else ref[:77] + "..."
    try:
        with _open(ref) as im:  # the bomb guard runs here, on the header alone
            if im.format in ("PNG", "JPEG"):
                return _decode_with_opencv(im, short)
            im.load()  # raises on truncated data instead of yielding grey rows later
            return np.asarray(im.convert("RGB") if im.mode != "RGB" else im)
    except ImageLoadError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageLoadError(
            f"image {short} is larger than PIL's decompression-bomb limit "
            f"({Image.MAX_IMAGE_PIXELS} pixels); raise PIL.Image.MAX_IMAGE_PIXELS only for "
            "trusted data"
        ) from exc
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageLoadError(f"image {short} is corrupt or truncated: {exc}") from exc


def _decode_with_opencv(im: Image.Image, short: str) -> np.ndarray:
    """PNG/JPEG straight into one NumPy buffer (PIL peaks at ~3 frames for an 8K decode,
    its 4-byte internal image plus ``tobytes`` chunks; OpenCV at one). Same pixels as PIL;
    truncated files decode to None and are reported."""
    import cv2

    fp = im.fp
    fp.seek(0)
    data = np.frombuffer(fp.read(), np.uint8)
    arr = cv2.imdecode(data, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if arr is None:
        raise ImageLoadError(f"image {short} is corrupt or truncated ({im.format} data incomplete)")
    return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB, dst=arr)  # in place


class ImageStore:
    """A thread-safe LRU of decoded images, bounded by total bytes.

    One decode per reference while it stays cached: at 8K (100 MB RGB) the default
    1 GiB budget keeps about ten queries' images alive, enough for a batch in flight.
    """

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}
        self.decodes = 0  # how many times a reference was actually decoded (for tests/benchmarks)
        self._views: OrderedDict[tuple, str] = OrderedDict()
        self.max_views = 256

    def get(self, ref: str) -> np.ndarray:
        with self._lock:
            if ref in self._cache:
                self._cache.move_to_end(ref)
                return self._cache[ref]
            gate = self._loading.setdefault(ref, threading.Lock())
        with gate:  # concurrent requests for one image wait for a single decode
            with self._lock:
                if ref in self._cache:
                    return self._cache[ref]
            arr = load_image(ref)
            arr.setflags(write=False)  # shared between threads: nobody may write into it
            with self._lock:
                self.decodes += 1
                self._loading.pop(ref, None)
                self._cache[ref] = arr
                self._bytes += arr.nbytes
                while self._bytes > self.max_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._bytes -= old.nbytes
            return arr

    def size(self, ref: str) -> tuple[int, int]:
        """(width, height) of the original image."""
        arr = self.get(ref)
        return arr.shape[1], arr.shape[0]

    def model_view(self, ref: str, resize: ResizeSpec | None = None, fmt: str = "PNG") -> str:
        """The image as the model will see it (smart-resized), base64-encoded, cached.

        Sending the resized image (not the 8K original) keeps requests small and makes the
        model's pixel coordinates exactly the frame that ``ResizeSpec`` maps back from.
        """
        key = (ref, resize, fmt)
        with self._lock:
            if key in self._views:
                self._views.move_to_end(key)
                return self._views[key]
        arr = self.get(ref)
        if resize is not None:
            h, w = arr.shape[:2]
            tw, th = resize.size(w, h)
            if (tw, th) != (w, h):  # OpenCV works on the cached array in place: no 4-byte PIL copy
                import cv2

                interp = cv2.INTER_AREA if tw * th < w * h else cv2.INTER_CUBIC
                arr = cv2.resize(arr, (tw, th), interpolation=interp)
        encoded = encode_image(arr, fmt)
        with self._lock:
            self._views[key] = encoded
            while len(self._views) > self.max_views:
                self._views.popitem(last=False)
        return encoded

    def forget(self, ref: str) -> None:
        """Drop one reference's decoded array and encoded views."""
        with self._lock:
            arr = self._cache.pop(ref, None)
            if arr is not None:
                self._bytes -= arr.nbytes
            for key in [k for k in self._views if k[0] == ref]:
                del self._views[key]

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._views.clear()
            self._bytes = 0
            self.decodes = 0


_DEFAULT_STORE = ImageStore()


def default_store() -> ImageStore:
    """The process-wide store used by the tools and graph nodes unless given another."""
    return _DEFAULT_STORE


def encode_image(arr: np.ndarray, fmt: str = "PNG", quality: int = 92) -> str:
    """Encode an RGB array as a base64 string (PNG is lossless; JPEG is smaller)."""
    buf = io.BytesIO()
    im = Image.fromarray(np.ascontiguousarray(arr))
    if fmt.upper() == "JPEG":
        im.save(buf, format="JPEG", quality=quality)
    else:
        im.save(buf, format="PNG", compress_level=1)
    return base64.b64encode(buf.getvalue()).decode("ascii")
