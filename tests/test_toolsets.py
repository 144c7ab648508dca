import textwrap

import pytest

from helpers import judge, speculator
from speceyes_graph import ToolsetError, create_speceyes_graph, load_toolset
from speceyes_graph.agents.toolsets import BUILTIN_TOOLSETS, build_tools
from speceyes_graph.models import ScriptedChatModel


def names(toolset):
    return [t.name for t in build_tools(load_toolset(toolset))]


def test_builtin_toolsets():
    assert names("deepeyes") == ["image_zoom_in_tool"]
    assert names("vision") == ["crop", "zoom", "ocr"]
    assert set(BUILTIN_TOOLSETS) >= {"deepeyes", "vision"}


def test_toml_toolset_with_settings_and_a_user_tool(tmp_path, monkeypatch, scene):
    (tmp_path / "my_tools.py").write_text(
        textwrap.dedent('''
        from langchain_core.tools import tool

        @tool
        def shout(text: str) -> str:
            """Upper-case the text."""
            return text.upper()

        def whisper(text: str) -> str:
            """Lower-case the text."""
            return text.lower()
    ''')
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.toml"
    path.write_text(
        textwrap.dedent("""
        name = "custom"
        [[tools]]
        name = "zoom"
        min_output_side = 112
        coordinates = "thousand"
        [[tools]]
        name = "my_tools:shout"
        [[tools]]
        name = "my_tools:whisper"
    """)
    )
    ts = load_toolset(path)
    assert ts.name == "custom" and ts.tools[0].settings == {
        "min_output_side": 112,
        "coordinates": "thousand",
    }
    tools = build_tools(ts)
    assert [t.name for t in tools] == ["zoom", "shout", "whisper"]
    assert tools[1].invoke({"text": "hi"}) == "HI" and tools[2].invoke({"text": "HI"}) == "hi"
    content, artifact = tools[0].func(bbox=[250, 250, 500, 500], state={"images": [scene]})
    assert artifact["box"] == [320, 180, 640, 360]  # 0-1000 coordinates on a 1280x720 image
    agent = ScriptedChatModel(respond=lambda m: "<answer>x</answer>")
    g = create_speceyes_graph(judge=judge("yes"), speculator=speculator(), agent=agent, tools=path)
    assert g.compile().invoke({"question": "q", "images": [scene]})["answer"] == "x"
    assert [t.name for t in agent.bound_tools] == ["zoom", "shout", "whisper"]


def test_yaml_toolset(tmp_path):
    pytest.importorskip("yaml", reason="PyYAML is an optional extra")
    path = tmp_path / "t.yaml"
    path.write_text("name: y\ntools:\n  - name: crop\n    min_side: 56\n  - image_zoom_in_tool\n")
    assert names(path) == ["crop", "image_zoom_in_tool"]


@pytest.mark.parametrize(
    "body, message",
    [
        ('[[tools]]\nname = "telescope"\n', "unknown tool 'telescope'"),
        ('[[tools]]\nname = "zoom"\nmagnification = 3\n', "does not take \\['magnification'\\]"),
        ('[[tools]]\nname = "zoom"\ncoordinates = "polar"\n', "unknown coordinates"),
        ('[[tools]]\nname = "nosuchmodule_xyz:thing"\n', "cannot import"),
        ('[[tools]]\nname = "crop"\n[[tools]]\nname = "crop"\n', "names a tool twice"),
        ('tools = "zoom"\n', "expected a list"),
        ("[[tools]\n", "invalid TOML"),
        ('[[tools]]\nname = "ocr"\ntesseract_cmd = "/no/such/tesseract"\n', "Tesseract binary"),
    ],
)
def test_bad_toolsets_fail_at_build_time(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ToolsetError, match=message):
        create_speceyes_graph(
            judge=judge("yes"), speculator=speculator(), agent=judge("x"), tools=path
        )


def test_unknown_toolset_name():
    with pytest.raises(ToolsetError, match="not a built-in"):
        load_toolset("telescopes")
