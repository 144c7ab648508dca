"""Photos with an EXIF orientation are read the way viewers show them, everywhere.

A phone stores a portrait photo as landscape pixels plus "turn 90 degrees clockwise"
(orientation 6). The models must see the upright picture, and the boxes they write about it
must crop the same pixels: the store's decode, the image a served model is sent, the zoom
tools' frame and the file the code sandbox opens all agree.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from speceyes_tools import ImageStore, ResizeSpec, image_zoom_in_tool, load_image
from speceyes_tools.images import exif_orientation, upright

WIDTH, HEIGHT = 400, 800  # as displayed: a portrait photo
BOX = (40, 560, 160, 680)  # the red object, in displayed pixels


def upright_scene() -> np.ndarray:
    arr = np.full((HEIGHT, WIDTH, 3), 235, np.uint8)
    x1, y1, x2, y2 = BOX
    arr[y1:y2, x1:x2] = (220, 20, 20)
    return arr


# the inverse of each orientation's transform (6 and 8 are each other's inverse)
_INVERSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def save_with_orientation(path, displayed: np.ndarray, orientation: int, fmt: str = "JPEG"):
    """Store ``displayed`` as a camera would: raw pixels that ``orientation`` turns upright."""
    pil = Image.fromarray(displayed)
    stored = pil.transpose(_INVERSE[orientation]) if orientation in _INVERSE else pil
    exif = Image.Exif()
    exif[0x0112] = orientation
    extra = {"quality": 95} if fmt == "JPEG" else {}
    stored.save(path, format=fmt, exif=exif.tobytes(), **extra)
    return str(path)


def red_share(arr: np.ndarray) -> float:
    return float(((arr[..., 0] > 180) & (arr[..., 1] < 90)).mean())


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_every_orientation_decodes_as_pil_shows_it(tmp_path, orientation, fmt):
    gradient = np.zeros((30, 50, 3), np.uint8)
    gradient[..., 0] = np.arange(50) * 5
    gradient[..., 1] = np.arange(30)[:, None] * 8
    path = save_with_orientation(tmp_path / f"g.{fmt.lower()}", gradient, orientation, fmt)
    expected = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    ours = load_image(path)
    assert ours.shape == expected.shape == (30, 50, 3)
    jpeg_slack = 8 if fmt == "JPEG" else 0  # OpenCV and PIL may bundle different JPEG decoders
    assert np.abs(ours.astype(int) - expected.astype(int)).max() <= jpeg_slack
    assert np.abs(ours.astype(int) - gradient.astype(int)).mean() < 3  # the upright picture
    assert exif_orientation(open(path, "rb").read()) == orientation


def test_a_phone_portrait_is_decoded_upright(tmp_path):
    path = save_with_orientation(tmp_path / "portrait.jpg", upright_scene(), 6)
    with Image.open(path) as raw:
        assert raw.size == (HEIGHT, WIDTH)  # stored sideways, 800x400
    store = ImageStore()
    arr = store.get(path)
    assert arr.shape == (HEIGHT, WIDTH, 3) and store.size(path) == (WIDTH, HEIGHT)
    x1, y1, x2, y2 = BOX
    assert red_share(arr[y1:y2, x1:x2]) > 0.95


def test_the_zoom_on_a_rotated_photo_holds_the_object(tmp_path):
    path = save_with_orientation(tmp_path / "portrait.jpg", upright_scene(), 6)
    spec = ResizeSpec()
    seen_w, seen_h = spec.size(WIDTH, HEIGHT)  # the frame the model saw: upright
    assert seen_h > seen_w
    sx, sy = seen_w / WIDTH, seen_h / HEIGHT
    model_box = [BOX[0] * sx, BOX[1] * sy, BOX[2] * sx, BOX[3] * sy]
    content, artifact = image_zoom_in_tool.func(bbox_2d=model_box, state={"images": [path]})
    assert artifact["box"] == pytest.approx(BOX, abs=2)
    crop = np.asarray(Image.open(io.BytesIO(base64.b64decode(content[1]["base64"]))))
    assert red_share(crop) > 0.9


def test_a_served_model_is_sent_the_upright_picture(tmp_path):
    """What goes over the wire is a PNG of the upright pixels (a PNG carries no orientation,
    so a server cannot turn it twice)."""
    from langchain_core.messages import HumanMessage

    from speceyes_graph.messages import hydrate, image_blocks

    path = save_with_orientation(tmp_path / "portrait.jpg", upright_scene(), 6)
    store = ImageStore()
    spec = ResizeSpec()
    message = HumanMessage(content=image_blocks([path], spec, store))
    block = hydrate([message], store)[0].content[0]
    sent = Image.open(io.BytesIO(base64.b64decode(block["base64"])))
    assert sent.format == "PNG" and sent.size == spec.size(WIDTH, HEIGHT)
    assert exif_orientation(base64.b64decode(block["base64"])) == 1
    sx, sy = sent.size[0] / WIDTH, sent.size[1] / HEIGHT
    x1, y1, x2, y2 = (
        int(BOX[0] * sx) + 3,
        int(BOX[1] * sy) + 3,
        int(BOX[2] * sx) - 3,
        int(BOX[3] * sy) - 3,
    )
    assert red_share(np.asarray(sent.convert("RGB"))[y1:y2, x1:x2]) > 0.95


def test_pasted_rotated_photos_are_upright_too():
    buf = io.BytesIO()
    pil = Image.fromarray(upright_scene()).transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6
    pil.save(buf, format="JPEG", quality=95, exif=exif.tobytes())
    url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    assert load_image(url).shape == (HEIGHT, WIDTH, 3)


def test_malformed_exif_is_ignored():
    assert exif_orientation(b"not an image") == 1
    arr = np.zeros((2, 3, 3), np.uint8)
    assert upright(arr, 99) is arr and upright(arr, 6).shape == (3, 2, 3)


def test_the_sandbox_opens_the_photo_upright_under_the_name_the_prompt_gives(tmp_path):
    from speceyes_tools import make_python_sandbox_tool
    from speceyes_tools.python_tool import sandbox_image_path

    path = save_with_orientation(tmp_path / "IMG_0042.jpg", upright_scene(), 6)
    assert sandbox_image_path(path) == ("/mnt/data/images/IMG_0042.png", (WIDTH, HEIGHT))
    x1, y1, x2, y2 = BOX
    code = (
        "import os\nimport numpy as np\n"
        "im = Image.open(image_path)\n"
        f"a = np.asarray(im.convert('RGB'))[{y1 + 4}:{y2 - 4}, {x1 + 4}:{x2 - 4}]\n"
        "print(os.path.basename(image_path), im.size[0], im.size[1], round(float((a[..., 0] > 180).mean()), 2))"
    )
    out = make_python_sandbox_tool().invoke({"code": code, "state": {"images": [path]}})
    name, w, h, share = out.split()
    assert (name, int(w), int(h)) == ("IMG_0042.png", WIDTH, HEIGHT)
    assert float(share) > 0.95


# --- TIFF: the orientation is a tag of the image file directory, not an EXIF block ----------

TIFF_COMPRESSIONS = ["raw", "tiff_lzw", "group4", "jpeg"]


def save_tiff(path, displayed: np.ndarray, orientation: int, compression: str, pages: int = 1):
    """A TIFF whose stored pixels ``orientation`` turns into ``displayed``; ``group4`` is a
    fax (1 bit), ``pages`` > 1 adds pages that must not be shown."""
    pil = Image.fromarray(displayed)
    if compression == "group4":
        pil = pil.convert("L").point(lambda v: 255 if v > 128 else 0).convert("1")
    stored = pil.transpose(_INVERSE[orientation]) if orientation in _INVERSE else pil
    extra = [Image.new(stored.mode, (7, 5), 0) for _ in range(pages - 1)]
    stored.save(
        path,
        format="TIFF",
        compression=compression,
        tiffinfo={0x0112: orientation},
        save_all=pages > 1,
        append_images=extra,
    )
    return str(path)


def pil_upright(path) -> np.ndarray:
    """What viewers show: Pillow's own exif_transpose of the first frame."""
    with Image.open(path) as im:
        return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("compression", TIFF_COMPRESSIONS)
def test_every_tiff_orientation_decodes_as_pil_shows_it(tmp_path, orientation, compression):
    gradient = np.zeros((30, 50, 3), np.uint8)
    gradient[..., 0] = np.arange(50) * 5
    gradient[..., 1] = np.arange(30)[:, None] * 8
    gradient[5:12, 3:9] = 255  # an asymmetric mark: any wrong turn moves it
    path = save_tiff(tmp_path / "g.tif", gradient, orientation, compression)
    expected = pil_upright(path)
    assert expected.shape == (30, 50, 3)
    store = ImageStore()
    ours = store.get(path)
    assert np.array_equal(ours, expected)  # pixel for pixel: the same decoder, turned once
    assert store.cache.decodes == 1
    assert exif_orientation(open(path, "rb").read()) == orientation


@pytest.mark.parametrize("orientation", [1, 6, 7])
def test_a_multipage_tiff_shows_its_first_page_upright(tmp_path, orientation):
    path = save_tiff(tmp_path / "pages.tif", upright_scene(), orientation, "tiff_lzw", pages=3)
    arr = load_image(path)
    assert arr.shape == (HEIGHT, WIDTH, 3) and np.array_equal(arr, pil_upright(path))


def test_a_portrait_tiff_is_upright_in_every_path(tmp_path):
    """The store, the zoom tools' frame, the PNG a served model is sent and the file the
    code sandbox opens all show the upright page (Pillow turns TIFFs itself while loading;
    turning again would show it sideways)."""
    from langchain_core.messages import HumanMessage

    from speceyes_graph.messages import hydrate, image_blocks
    from speceyes_tools.python_tool import sandbox_image

    path = save_tiff(tmp_path / "scan.tif", upright_scene(), 6, "tiff_lzw")
    store = ImageStore()
    assert store.size(path) == (WIDTH, HEIGHT)
    x1, y1, x2, y2 = BOX
    assert red_share(store.get(path)[y1:y2, x1:x2]) > 0.95

    spec = ResizeSpec()
    seen_w, seen_h = spec.size(WIDTH, HEIGHT)
    sx, sy = seen_w / WIDTH, seen_h / HEIGHT
    model_box = [BOX[0] * sx, BOX[1] * sy, BOX[2] * sx, BOX[3] * sy]
    content, artifact = image_zoom_in_tool.func(bbox_2d=model_box, state={"images": [path]})
    assert artifact["box"] == pytest.approx(BOX, abs=2)
    crop = np.asarray(Image.open(io.BytesIO(base64.b64decode(content[1]["base64"]))))
    assert red_share(crop) > 0.9

    message = HumanMessage(content=image_blocks([path], spec, store))
    sent = Image.open(
        io.BytesIO(base64.b64decode(hydrate([message], store)[0].content[0]["base64"]))
    )
    assert sent.format == "PNG" and sent.size == (seen_w, seen_h)

    data, name, size = sandbox_image(path, store)
    assert name == "scan.png" and size == (WIDTH, HEIGHT)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), store.get(path))


def exif_after_pixels(path: str) -> str:
    """Move a PNG file's eXIf chunk behind its IDAT chunks (as some tools write it)."""
    data = open(path, "rb").read()
    start = data.index(b"eXIf") - 4
    length = int.from_bytes(data[start : start + 4], "big")
    chunk = data[start : start + 12 + length]
    rest = data[:start] + data[start + 12 + length :]
    end = rest.index(b"IEND") - 4
    with open(path, "wb") as f:
        f.write(rest[:end] + chunk + rest[end:])
    return path


def test_a_png_whose_exif_follows_the_pixels_is_turned_without_a_second_decode(tmp_path):
    """PNG allows the eXIf chunk after the image data; Pillow then finds it only by decoding
    the whole image. The header walk finds it in the chunk list."""
    path = exif_after_pixels(
        save_with_orientation(tmp_path / "late.png", upright_scene(), 6, "PNG")
    )
    late = open(path, "rb").read()
    with Image.open(io.BytesIO(late)) as im:
        assert "exif" not in im.info  # Pillow has not seen it from the header
    assert exif_orientation(late) == 6
    assert np.array_equal(load_image(path), pil_upright(path))


@pytest.mark.parametrize("shape", [(37, 53), (37, 53, 1), (37, 53, 3), (37, 53, 4)])
def test_every_turn_is_the_same_in_opencv_and_numpy(shape):
    """8-bit images turn in OpenCV (faster), others in numpy: both give the same pixels."""
    from speceyes_tools.codec import _UPRIGHT, upright

    rng = np.random.default_rng(1)
    for dtype in (np.uint8, np.uint16):
        a = rng.integers(0, 255, shape).astype(dtype)
        for orientation in range(2, 9):
            got = upright(a, orientation)
            assert got.flags.c_contiguous and got.dtype == dtype
            assert np.array_equal(got, _UPRIGHT[orientation](a)), (dtype, orientation)
