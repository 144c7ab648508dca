import json
import shutil

import numpy as np
import pytest
from langchain_core.messages import AIMessage
from langgraph.prebuilt import ToolNode
from PIL import Image, ImageDraw, ImageFont

from speceyes_tools import (
    BoxError,
    ImageLoadError,
    ImageStore,
    PixelBox,
    ResizeSpec,
    clamp_box,
    crop,
    crop_array,
    default_store,
    image_zoom_in_tool,
    load_image,
    ocr_array,
    parse_box,
    put_bytes,
    smart_resize,
    to_original,
    zoom,
    zoom_array,
)
from speceyes_tools.geometry import limit_aspect
from speceyes_tools.tesseract import (
    OCRUnavailable,
    check_tesseract,
    make_ocr_tool,
    preprocess_for_ocr,
)


def decode_block(block):
    import base64
    import io

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(block["base64"]))).convert("RGB"))


# --- geometry --------------------------------------------------------------------------------


def test_smart_resize_matches_transformers():
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf

    for h, w in [(2160, 3840), (4320, 7680), (100, 100), (1500, 1690), (1440, 5759), (30, 500)]:
        for spec in (
            ResizeSpec(),
            ResizeSpec(factor=32, min_pixels=64 * 64, max_pixels=1024 * 32 * 32),
        ):
            assert smart_resize(h, w, spec.factor, spec.min_pixels, spec.max_pixels) == hf(
                h, w, factor=spec.factor, min_pixels=spec.min_pixels, max_pixels=spec.max_pixels
            )


def test_model_coordinates_map_back_through_a_real_smart_resize():
    spec = ResizeSpec()
    seen_w, seen_h = spec.size(3840, 2160)
    assert (seen_w, seen_h) == (1316, 728) and seen_w % 28 == 0 and seen_h % 28 == 0
    box = to_original((seen_w / 4, seen_h / 4, seen_w / 2, seen_h / 2), (3840, 2160), "model", spec)
    assert box == pytest.approx((960, 540, 1920, 1080))
    assert to_original((0.25, 0.25, 0.5, 0.5), (3840, 2160), "normalized") == pytest.approx(
        (960, 540, 1920, 1080)
    )
    assert to_original((250, 250, 500, 500), (3840, 2160), "thousand") == pytest.approx(
        (960, 540, 1920, 1080)
    )
    assert to_original((1, 2, 3, 4), (3840, 2160), "original") == (1, 2, 3, 4)


@pytest.mark.parametrize(
    "raw, message",
    [
        ([1, 2, 3], "exactly 4"),
        ([1, 2, 3, 4, 5], "exactly 4"),
        ([1, "x", 3, 4], "must be numbers"),
        ([1, float("nan"), 3, 4], "finite"),
        ([1, 2, float("inf"), 4], "finite"),
        ("10, 20, 30, 40", "string"),
        (None, "list of 4 numbers"),
        ({"x1": 1}, "list of 4 numbers"),
        ([True, 2, 3, 4], "must be numbers"),
    ],
)
def test_bad_boxes_get_clear_messages(raw, message):
    with pytest.raises(BoxError, match=message):
        parse_box(raw)


def test_clamping_swapping_enlarging():
    assert parse_box(["10", 20, 30.5, 40]) == (10.0, 20.0, 30.5, 40.0)
    b = clamp_box((300, 200, 100, 50), 1000, 800)
    assert (
        b.as_list() == [100, 50, 300, 200]
        and "swapped x1/x2" in b.notes
        and "swapped y1/y2" in b.notes
    )
    b = clamp_box((-50, -10, 2000, 900), 1000, 800)
    assert b.as_list() == [0, 0, 1000, 800] and "clamped to the image" in b.notes
    b = clamp_box((100, 100, 105, 103), 1000, 800)
    assert (b.width, b.height) == (28, 28) and b.x1 <= 100 and b.x2 >= 105
    b = clamp_box((995, 795, 999, 799), 1000, 800)  # tiny box in a corner: shifted inside
    assert b.as_list() == [972, 772, 1000, 800]
    b = clamp_box((5.2, 5.7, 100.1, 60.2), 1000, 800)
    assert b.as_list() == [5, 5, 101, 61]  # rounded outwards
    with pytest.raises(BoxError, match="zero area"):
        clamp_box((1200, 100, 1500, 200), 1000, 800)  # entirely right of the image
    with pytest.raises(BoxError, match="zero area"):
        clamp_box((100, 100, 100, 200), 1000, 800)
    thin = limit_aspect(PixelBox(0, 100, 1000, 101), 1000, 800, 100.0)
    assert thin.width / thin.height <= 100


# --- crop and zoom on arrays ---------------------------------------------------------------------


def test_crop_is_an_exact_view(gradient_image):
    _, arr = gradient_image
    box = PixelBox(300, 200, 700, 260)
    out = crop_array(arr, box)
    assert out.shape == (60, 400, 3)
    assert np.shares_memory(out, arr)  # no copy of the big image
    assert tuple(out[0, 0]) == (300 % 256, 200, (300 // 256 + 0) % 256)
    assert tuple(out[-1, -1]) == (699 % 256, 259 % 256, (699 // 256 + 259 // 256) % 256)


def test_zoom_geometry():
    arr = np.zeros((500, 800, 3), np.uint8)
    arr[100:150, 200:260] = (255, 0, 0)
    out = zoom_array(arr, PixelBox(200, 100, 260, 150), min_side=224)
    assert out.shape[0] % 28 == 0 and out.shape[1] % 28 == 0 and min(out.shape[:2]) >= 224
    assert abs(out.shape[1] / out.shape[0] - 60 / 50) < 0.15  # aspect kept
    assert (out[..., 0] > 200).mean() > 0.95  # the zoomed region is the red patch


def test_zoom_tool_through_the_model_frame(tmp_path):
    arr = np.full((2160, 3840, 3), 240, np.uint8)
    arr[1000:1040, 2000:2040] = (0, 0, 255)
    path = tmp_path / "4k.png"
    Image.fromarray(arr).save(path)
    sx, sy = 1316 / 3840, 728 / 2160  # the frame the model saw
    model_box = [2000 * sx, 1000 * sy, 2040 * sx, 1040 * sy]
    content, artifact = image_zoom_in_tool.func(bbox_2d=model_box, state={"images": [str(path)]})
    x1, y1, x2, y2 = artifact["box"]
    assert (
        abs(x1 - 2000) <= 2 and abs(y1 - 1000) <= 2 and abs(x2 - 2040) <= 2 and abs(y2 - 1040) <= 2
    )
    img = decode_block(content[1])
    assert (img[..., 2] > 200).mean() > 0.9 and img.shape[0] >= 56


def test_tools_as_langchain_tools(scene):
    msg = crop.invoke(
        {
            "type": "tool_call",
            "id": "c1",
            "name": "crop",
            "args": {"bbox": [100, 100, 200, 200], "state": {"images": [scene]}},
        }
    )
    assert msg.artifact["tool"] == "crop" and msg.content[1]["type"] == "image"
    seen = ResizeSpec().size(1280, 720)
    assert seen == (1288, 728)  # 1280x720 rounds to 28-multiples
    assert (
        "bbox" in zoom.args and "state" not in zoom.args
    )  # state is injected, hidden from the model
    assert set(image_zoom_in_tool.args) == {"bbox_2d", "label"}


def test_bad_box_goes_back_to_the_model_through_tool_node(scene):
    node = ToolNode([image_zoom_in_tool, zoom])
    calls = [
        {
            "name": "image_zoom_in_tool",
            "args": {"bbox_2d": [5000, 5000, 6000, 6000]},
            "id": "a",
            "type": "tool_call",
        },
        {
            "name": "image_zoom_in_tool",
            "args": {"bbox_2d": [1, 2, 3]},
            "id": "b",
            "type": "tool_call",
        },
        {"name": "zoom", "args": {"bbox": [float("nan"), 1, 2, 3]}, "id": "c", "type": "tool_call"},
        {
            "name": "zoom",
            "args": {"bbox": [10, 10, 80, 80], "image_index": 3},
            "id": "d",
            "type": "tool_call",
        },
    ]
    from typing import Annotated

    from langgraph.graph import StateGraph
    from langgraph.graph.message import add_messages
    from typing_extensions import TypedDict

    class S(TypedDict):
        messages: Annotated[list, add_messages]
        images: list[str]

    g = StateGraph(S)
    g.add_node("tools", node)
    g.set_entry_point("tools")
    out = g.compile().invoke(
        {"messages": [AIMessage(content="", tool_calls=calls)], "images": [scene]}
    )
    out["messages"] = out["messages"][1:]
    texts = [
        m.content if isinstance(m.content, str) else json.dumps(m.content) for m in out["messages"]
    ]
    assert "zero area" in texts[0]
    assert "bbox_2d" in texts[1]  # schema validation error, reported to the model
    assert "finite" in texts[2]
    assert "out of range" in texts[3]


def test_no_image_in_state_is_a_clear_tool_error():
    content = zoom.invoke({"bbox": [0, 0, 10, 10], "state": {}})
    assert "no image is attached" in content


# --- loading --------------------------------------------------------------------------------------


def test_decompression_bomb_guard_stays_on(tmp_path, monkeypatch):
    path = tmp_path / "big.png"
    Image.new("RGB", (3000, 3000)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)  # 9 MP > 2x limit: a "bomb"
    with pytest.raises(ImageLoadError, match="decompression-bomb"):
        load_image(str(path))


def test_truncated_and_corrupt_files(tmp_path):
    good = tmp_path / "good.jpg"
    Image.new("RGB", (400, 300), (10, 200, 30)).save(good, quality=90)
    data = good.read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageLoadError, match="corrupt or truncated"):
        load_image(str(tmp_path / "cut.jpg"))
    with pytest.raises(ImageLoadError, match="not found"):
        load_image(str(tmp_path / "nope.jpg"))
    with pytest.raises(ImageLoadError, match="unsupported image reference"):
        load_image("mem://0000")
    with pytest.raises(ImageLoadError, match="not in this image store"):
        load_image("blob://" + "0" * 64)
    ref = put_bytes(data)
    assert default_store().get(ref).shape == (300, 400, 3)
    import base64

    assert load_image("data:image/jpeg;base64," + base64.b64encode(data).decode()).shape == (
        300,
        400,
        3,
    )
    assert load_image("file://" + str(good)).shape == (300, 400, 3)


def test_store_decodes_once_and_is_bounded(scene, tmp_path):
    store = ImageStore(max_bytes=1280 * 720 * 3 * 2)
    a = store.get(scene)
    assert store.get(scene) is a and store.cache.decodes == 1
    assert not a.flags.writeable
    store.model_view(scene, ResizeSpec())
    store.model_view(scene, ResizeSpec())
    assert store.cache.decodes == 1
    others = []
    for i in range(3):
        p = tmp_path / f"o{i}.png"
        Image.new("RGB", (1280, 720)).save(p)
        others.append(str(p))
        store.get(str(p))
    assert store.cache.memory.nbytes <= store.cache.memory.max_bytes  # LRU eviction bounds memory


def test_graph_decodes_each_image_once_per_query(scene):
    from helpers import deepeyes_agent, judge, speculator
    from speceyes_graph import create_speceyes_graph

    g = create_speceyes_graph(
        judge=judge("no"), speculator=speculator("A", 4.0), agent=deepeyes_agent()
    ).compile()
    out = g.invoke({"question": "colour?", "images": [scene]})
    assert out["route"] == "rejected-agentic" and len(out["agent_steps"]) == 2
    assert (
        default_store().cache.decodes == 1
    )  # judge, speculator, agent prompt and the zoom share one decode


# --- OCR -------------------------------------------------------------------------------------------


def render_text(text, px, pad=20, scale_canvas=1):
    font = ImageFont.load_default(size=px)
    w = int(font.getlength(text)) + 2 * pad
    img = Image.new("RGB", (w, px + 2 * pad), "white")
    ImageDraw.Draw(img).text((pad, pad), text, fill="black", font=font)
    return np.asarray(img)


ENGINES = [
    "pytesseract",
    pytest.param(
        "tesserocr",
        marks=pytest.mark.skipif(
            __import__("importlib").util.find_spec("tesserocr") is None,
            reason="tesserocr (fast-ocr extra) not installed",
        ),
    ),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("px", [12, 24])
def test_ocr_reads_rendered_text(px, engine):
    arr = render_text("SPEED LIMIT 45 Main Street", px)
    result = ocr_array(arr, engine=engine)
    words = {w["text"] for w in result["words"]}
    assert {"SPEED", "LIMIT", "45", "Main"} <= words, result["text"]
    first = next(w for w in result["words"] if w["text"] == "SPEED")
    x1, y1, x2, y2 = first["box"]
    assert 10 <= x1 <= 30 and 10 <= y1 <= 30 + px and x2 > x1 and 0 <= first["confidence"] <= 100


@pytest.mark.parametrize("engine", ENGINES)
def test_ocr_tool_on_a_box_returns_original_coordinates(tmp_path, engine):
    canvas = np.full((900, 1600, 3), 255, np.uint8)
    text = render_text("EXIT 12", 24)
    canvas[500 : 500 + text.shape[0], 700 : 700 + text.shape[1]] = text
    path = tmp_path / "sign.png"
    Image.fromarray(canvas).save(path)
    tool = make_ocr_tool(coordinates="original", engine=engine)
    content, artifact = tool.func(state={"images": [str(path)]}, bbox=[650, 450, 1000, 620])
    data = json.loads(content)
    assert "EXIT" in data["text"]
    exit_word = next(w for w in data["words"] if w["text"] == "EXIT")
    assert 700 <= exit_word["box"][0] <= 740 and 500 <= exit_word["box"][1] <= 560
    assert artifact["box"] == [650, 450, 1000, 620]


def test_ocr_preprocessing_upscales_small_regions():
    small = render_text("tiny", 12)
    out, scale = preprocess_for_ocr(small)
    assert scale == 3.0 and out.ndim == 2 and out.shape[0] == small.shape[0] * 3
    binary, _ = preprocess_for_ocr(small, binarize=True)
    assert set(np.unique(binary)) <= {0, 255}
    big = np.full((1200, 1600, 3), 255, np.uint8)
    assert preprocess_for_ocr(big)[1] == 1.0


def test_the_ocr_default_is_what_the_measurement_chose():
    """Otsu is off by default because it costs recall on the smallest text
    (docs/api/tools.md): on 8 px lines the default reads at least as many words, and more."""
    from PIL import ImageDraw, ImageFont

    words = "store open exit main street north road hotel cafe bank park lane 24 7 45 B12".split()
    rng = np.random.default_rng(8)
    font = ImageFont.load_default(size=8)
    recall = {False: 0, True: 0}
    total = 0
    for i in range(24):
        text = " ".join(str(w) for w in rng.choice(words, 4))
        img = Image.new(
            "RGB", (int(font.getlength(text)) + 40, 48), (230, 220, 200) if i % 2 else "white"
        )
        ImageDraw.Draw(img).text((20, 20), text, fill=(30, 30, 30), font=font)
        arr = np.asarray(img)
        total += 4
        for binarize in recall:
            image = preprocess_for_ocr(arr, binarize=binarize)[0]
            read = {w["text"] for w in ocr_array(image, preprocess=False, psm=6)["words"]}
            recall[binarize] += sum(w in read for w in text.split())
    default, _ = preprocess_for_ocr(np.asarray(img))
    assert len(np.unique(default)) > 2  # the default does not binarise
    assert recall[False] > recall[True], (recall, total)


def test_missing_tesseract_is_a_clear_startup_error(monkeypatch):
    with pytest.raises(OCRUnavailable, match="apt-get install tesseract-ocr"):
        check_tesseract("/nonexistent/tesseract")
    with pytest.raises(OCRUnavailable):
        make_ocr_tool(tesseract_cmd="no-such-tesseract-binary")
    assert shutil.which("tesseract")  # CI installs it; the real-OCR tests above need it
