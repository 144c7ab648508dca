"""Swap the agent's tools declaratively: a TOML toolset with a user-defined tool.

The scripted agent (native tool calling) calls the user's ``brightness`` tool and the
built-in ``zoom`` (0-1000 coordinates, from the TOML settings), then answers.
"""

import sys
import tempfile
from pathlib import Path

from langchain_core.messages import AIMessage

from speceyes_graph import create_speceyes_graph, load_toolset
from speceyes_graph.demo.example import make_example_models, make_example_scenes
from speceyes_graph.models import ScriptedChatModel

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))  # so that "my_tools:brightness" imports

toolset = load_toolset(here / "my_toolset.toml")
print("toolset", toolset.name, "->", [spec.name for spec in toolset.tools])


def agent(messages):
    done = [m for m in messages if m.type == "tool"]
    if len(done) == 0:
        return AIMessage(content="", tool_calls=[{"name": "brightness", "args": {}, "id": "b1"}])
    if len(done) == 1:
        return AIMessage(
            content="",
            tool_calls=[{"name": "zoom", "args": {"bbox": [750, 930, 780, 975]}, "id": "z1"}],
        )
    return AIMessage(content=f"<answer>A</answer> (tools said: {done[0].content})")


judge, speculator, _ = make_example_models()
graph = create_speceyes_graph(
    judge=judge,
    speculator=speculator,
    agent=ScriptedChatModel(respond=agent),
    tools=here / "my_toolset.toml",
).compile()
scene = make_example_scenes(Path(tempfile.mkdtemp()))[2]
out = graph.invoke({k: scene[k] for k in ("question", "images", "options")})
for step in out["agent_steps"]:
    for call in step["tool_calls"]:
        print(f"step {step['step']}: {call['name']} box={call.get('box')}")
print("route", out["route"], "answer", out["answer"])
