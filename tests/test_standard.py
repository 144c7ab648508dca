"""LangChain's standard conformance suites (``langchain-tests``) for ChatTransformersVLM, on
the tiny checkpoints and on the shipped demo checkpoints, and for every vision tool.

A tiny checkpoint writes random (or demo-world) text: it cannot call a tool or write JSON on
request.
Those standard tests are marked ``xfail`` (strict: an unexpected pass fails) with that
reason, and ``test_*_contract`` below proves the same contracts with a scripted ``generate``
behind the real model class (chat template, processor, batching, parsing, streaming).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import tempfile
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_tests.integration_tests import ChatModelIntegrationTests, ToolsIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests, ToolsUnitTests
from PIL import Image
from pydantic import BaseModel, Field
from scripted_generate import scripted_chat_model

from speceyes_graph.demo import demo_checkpoints
from speceyes_graph.models import ChatTransformersVLM
from speceyes_tools import (
    make_crop_tool,
    make_image_zoom_in_tool,
    make_ocr_tool,
    make_python_sandbox_tool,
    make_zoom_tool,
)

TINY_CANNOT = (
    "a tiny checkpoint (random, or trained only on the demo world) cannot write a tool call "
    "or JSON for an arbitrary tool on request; the contract is proven with a scripted "
    "generate (test_*_contract in this file)"
)


@functools.cache
def tiny() -> dict[str, str]:
    from speceyes_graph.demo.tiny import make_tiny_models

    return {k: str(v) for k, v in make_tiny_models(tempfile.mkdtemp(prefix="std-tiny-")).items()}


@functools.cache
def picture() -> bytes:
    """A PNG standing in for the picture the standard image test downloads (offline here)."""
    buf = io.BytesIO()
    Image.new("RGB", (320, 240), (40, 90, 200)).save(buf, format="PNG")
    return buf.getvalue()


def offline_picture(monkeypatch):
    """The standard image test downloads a picture with httpx; offline, the same URL answers
    with a local PNG."""
    real_get = httpx.get

    def get(url, *args, **kwargs):
        if "agentic-rag-output.png" in str(url):
            return httpx.Response(200, content=picture(), request=httpx.Request("GET", url))
        return real_get(url, *args, **kwargs)

    monkeypatch.setattr(httpx, "get", get)


class TestChatTransformersUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatTransformersVLM]:
        return ChatTransformersVLM

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": tiny()["large"]}

    @property
    def supports_image_inputs(self) -> bool:
        return True


class _CannotCallTools:
    """The integration tests a tiny checkpoint fails: expected to, strictly."""

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_tool_calling(self, model):
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    async def test_tool_calling_async(self, model):
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_bind_runnables_as_tools(self, model):
        super().test_bind_runnables_as_tools(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_tool_choice(self, model):
        super().test_tool_choice(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_tool_calling_with_no_arguments(self, model):
        super().test_tool_calling_with_no_arguments(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_structured_output(self, model, schema_type):
        super().test_structured_output(model, schema_type)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    async def test_structured_output_async(self, model, schema_type):
        await super().test_structured_output_async(model, schema_type)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_structured_output_pydantic_2_v1(self, model):
        super().test_structured_output_pydantic_2_v1(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_structured_output_optional_param(self, model):
        super().test_structured_output_optional_param(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_agent_loop(self, model):
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=TINY_CANNOT, strict=True)
    def test_unicode_tool_call_integration(self, model, tool_choice=None, force_tool_call=True):
        super().test_unicode_tool_call_integration(model, tool_choice, force_tool_call)


class _VLMIntegration(_CannotCallTools, ChatModelIntegrationTests):
    """The integration suite for one checkpoint; subclasses name the checkpoint."""

    checkpoint: str = ""

    @property
    def chat_model_class(self) -> type[ChatTransformersVLM]:
        return ChatTransformersVLM

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": self.checkpoint, "max_tokens": 16}

    @property
    def supports_image_inputs(self) -> bool:
        return True

    @property
    def supports_image_urls(self) -> bool:
        return True

    @property
    def supports_image_tool_message(self) -> bool:
        return True

    @pytest.fixture(autouse=True)
    def _offline_picture(self, monkeypatch):
        """The image test downloads a picture (with httpx, and through the model for the URL
        block); this machine has no internet, so the same URL answers with a local PNG."""
        offline_picture(monkeypatch)
        import speceyes_tools.images as images

        real_fetch = images.fetch_url
        monkeypatch.setattr(
            images,
            "fetch_url",
            lambda url, policy: (
                picture() if "agentic-rag-output.png" in url else real_fetch(url, policy)
            ),
        )


class TestTinyQwen25VLIntegration(_VLMIntegration):
    @property
    def checkpoint(self) -> str:  # type: ignore[override]
        return tiny()["large"]


class TestTinyQwen3VLIntegration(_VLMIntegration):
    @property
    def checkpoint(self) -> str:  # type: ignore[override]
        return tiny()["small"]


class TestShippedDemoLargeIntegration(_VLMIntegration):
    @property
    def checkpoint(self) -> str:  # type: ignore[override]
        return str(demo_checkpoints()["large"])


class TestShippedDemoSmallIntegration(_VLMIntegration):
    @property
    def checkpoint(self) -> str:  # type: ignore[override]
        return str(demo_checkpoints()["small"])


# --- the served chat model (ChatOpenAI plus what the server said), against real vLLM ----------


def _served_class():
    from speceyes_graph.models.served_chat import ServedChatModel

    return ServedChatModel


class TestServedChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type:
        return _served_class()

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "large", "base_url": "http://127.0.0.1:9/v1", "api_key": "EMPTY"}

    @property
    def supports_image_inputs(self) -> bool:
        return True


_VLLM: dict[str, str] = {}


@pytest.mark.vllm
class TestServedChatModelIntegration(_CannotCallTools, ChatModelIntegrationTests):
    """The demo's Qwen2.5-VL behind a real vLLM server (hermes tool parser on), through the
    client the graph uses. What the 2.8M-parameter checkpoint cannot do on request (call an
    arbitrary tool, write JSON) is expected to fail, strictly, as for the local model."""

    @pytest.fixture(autouse=True)
    def _server(self, vllm_servers, monkeypatch):
        _VLLM["url"] = vllm_servers["large"].url
        offline_picture(monkeypatch)

    @property
    def chat_model_class(self) -> type:
        return _served_class()

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            "model": "large",
            "base_url": _VLLM["url"],
            "api_key": "EMPTY",
            "max_tokens": 16,
            "stream_usage": True,
            # a client per test: langchain-openai would share one across the tests' event loops
            "http_async_client": httpx.AsyncClient(),
        }

    @property
    def supports_image_inputs(self) -> bool:
        return True


# --- the same contracts, with a scripted generate --------------------------------------------


@functools.cache
def _processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny()["large"])


def replies_by_tool(prompt: str) -> str:
    """A model that calls whichever tool the prompt declares, with sensible arguments, or
    answers after a tool result."""
    if "<tool_response>" in prompt or "<|im_start|>tool" in prompt:
        return "The result is 6."
    calls = {
        "magic_function": {"input": 3},
        "magic_function_no_args": {},
        "get_weather": {"location": "東京, 日本"},
        "Joke": {"setup": "Why?", "punchline": "Because."},
        "greet": {"name": "Ana"},
    }
    forced = prompt.rsplit("<|im_start|>assistant\n", 1)[-1]  # what tool_choice started
    for name, args in calls.items():
        if f'"name": "{name}"' in prompt:
            call = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            body = call if not forced else call[len(forced.removeprefix("<tool_call>\n")) :]
            return (body if forced else f"<tool_call>\n{body}") + "\n</tool_call>"
    return "Hello."


@pytest.fixture
def scripted():
    return scripted_chat_model(_processor(), replies_by_tool)


@tool
def magic_function(input: int) -> int:
    """Applies a magic function to an input."""
    return input + 2


@tool
def magic_function_no_args() -> int:
    """Calculates a magic function."""
    return 5


def test_tool_calling_contract(scripted):
    bound = scripted.bind_tools([magic_function])
    for reply in (
        bound.invoke("What is the value of magic_function(3)? Use the tool."),
        _aggregate(bound.stream("What is the value of magic_function(3)? Use the tool.")),
    ):
        assert reply.tool_calls[0]["name"] == "magic_function"
        assert reply.tool_calls[0]["args"] == {"input": 3} and reply.tool_calls[0]["id"]
        assert reply.usage_metadata["output_tokens"] > 0


async def test_tool_calling_async_contract(scripted):
    reply = await scripted.bind_tools([magic_function]).ainvoke("magic_function(3)?")
    assert reply.tool_calls[0]["args"] == {"input": 3}


def test_tool_calling_with_no_arguments_contract(scripted):
    reply = scripted.bind_tools([magic_function_no_args]).invoke("What is the magic value?")
    assert (
        reply.tool_calls[0]["name"] == "magic_function_no_args"
        and reply.tool_calls[0]["args"] == {}
    )


def test_tool_choice_contract(scripted):
    for choice in ("any", "magic_function"):
        reply = scripted.bind_tools([magic_function], tool_choice=choice).invoke("Hello!")
        assert reply.tool_calls[0]["name"] == "magic_function", choice
        assert reply.tool_calls[0]["args"] == {"input": 3}, choice


def test_bind_runnables_as_tools_contract(scripted):
    from langchain_core.runnables import RunnableLambda

    greet = RunnableLambda(lambda x: f"Hi {x['name']}").as_tool(
        name="greet", description="Greets someone.", arg_types={"name": str}
    )
    reply = scripted.bind_tools([greet], tool_choice="any").invoke("Greet Ana.")
    assert reply.tool_calls[0]["name"] == "greet" and reply.tool_calls[0]["args"] == {"name": "Ana"}


class Joke(BaseModel):
    """Joke to tell user."""

    setup: str = Field(description="question to set up a joke")
    punchline: str = Field(description="answer to resolve the joke")


def test_structured_output_contract(scripted):
    joke = scripted.with_structured_output(Joke).invoke("Tell me a joke about cats.")
    assert joke == Joke(setup="Why?", punchline="Because.")
    streamed = list(scripted.with_structured_output(Joke).stream("Tell me a joke."))
    assert streamed[-1] == joke


def test_agent_loop_contract(scripted):
    bound = scripted.bind_tools([magic_function])
    question = HumanMessage(content="What is magic_function(3)?")
    call = bound.invoke([question])
    result = magic_function.invoke(call.tool_calls[0])
    assert isinstance(result, ToolMessage) and result.content == "5"
    final = bound.invoke([question, call, result])
    assert (
        isinstance(final, AIMessage)
        and final.content == "The result is 6."
        and not final.tool_calls
    )


def test_unicode_tool_call_contract(scripted):
    @tool
    def get_weather(location: str) -> str:
        """Get the weather at a location."""
        return f"sunny in {location}"

    reply = scripted.bind_tools([get_weather], tool_choice="get_weather").invoke("天気は?")
    assert reply.tool_calls[0]["args"] == {"location": "東京, 日本"}


def _aggregate(chunks):
    whole = None
    for chunk in chunks:
        whole = chunk if whole is None else whole + chunk
    return whole


# --- the vision tools ------------------------------------------------------------------------


@functools.cache
def scene_path() -> str:
    image = Image.new("RGB", (640, 480), (245, 245, 245))
    image.paste((200, 30, 30), (100, 100, 200, 160))
    path = tempfile.mkstemp(suffix=".png", prefix="std-scene-")[1]
    image.save(path)
    return path


def _state() -> dict:
    return {"images": [scene_path()]}


class _ToolSuite:
    @property
    def tool_constructor(self):
        return self.make()

    @property
    def tool_invoke_params_example(self) -> dict:
        return {"bbox": [100, 100, 200, 160], "state": _state()}


class TestCropToolUnit(_ToolSuite, ToolsUnitTests):
    make = staticmethod(make_crop_tool)


class TestCropToolIntegration(_ToolSuite, ToolsIntegrationTests):
    make = staticmethod(make_crop_tool)


class TestZoomToolUnit(_ToolSuite, ToolsUnitTests):
    make = staticmethod(make_zoom_tool)


class TestZoomToolIntegration(_ToolSuite, ToolsIntegrationTests):
    make = staticmethod(make_zoom_tool)


class _DeepEyesSuite(_ToolSuite):
    make = staticmethod(make_image_zoom_in_tool)

    @property
    def tool_invoke_params_example(self) -> dict:
        return {"bbox_2d": [100, 100, 200, 160], "label": "the box", "state": _state()}


class TestImageZoomInToolUnit(_DeepEyesSuite, ToolsUnitTests):
    pass


class TestImageZoomInToolIntegration(_DeepEyesSuite, ToolsIntegrationTests):
    pass


class TestOCRToolUnit(_ToolSuite, ToolsUnitTests):
    make = staticmethod(make_ocr_tool)


class TestOCRToolIntegration(_ToolSuite, ToolsIntegrationTests):
    make = staticmethod(make_ocr_tool)


class _SandboxSuite(_ToolSuite):
    make = staticmethod(make_python_sandbox_tool)

    @property
    def tool_invoke_params_example(self) -> dict:
        code = (
            "from PIL import Image\n"
            "Image.open(image_path).crop((100, 100, 200, 160)).save("
            "'/mnt/data/temp_processed_images/crop.png')\n"
            "print('/mnt/data/temp_processed_images/crop.png')"
        )
        return {"code": code, "state": _state()}


class TestPythonSandboxToolUnit(_SandboxSuite, ToolsUnitTests):
    pass


class TestPythonSandboxToolIntegration(_SandboxSuite, ToolsIntegrationTests):
    pass


def test_tool_results_carry_pixels_for_the_model():
    """What the integration suites check only by type: the zoom result holds an image."""
    result = make_zoom_tool().invoke(
        {
            "name": "zoom",
            "args": {"bbox": [100, 100, 200, 160], "state": _state()},
            "id": "1",
            "type": "tool_call",
        }
    )
    image = next(b for b in result.content if isinstance(b, dict) and b.get("type") == "image")
    crop = Image.open(io.BytesIO(base64.b64decode(image["base64"])))
    assert min(crop.size) >= 224  # enlarged for the model
    box = result.artifact["box"]  # the model-frame box mapped back to the 640x480 original
    assert all(abs(a - b) <= 3 for a, b in zip(box, [100, 100, 200, 160], strict=True))
