"""SpecEyes as one node of a larger agent: visual questions go to SpecEyes, the rest to a
text model. The parent shares ``question``, ``images``, ``answer`` and ``route`` with the
compiled SpecEyes graph; its own chat history (``messages``) stays its own.
"""

import tempfile
from pathlib import Path
from typing import Annotated, Literal

from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from speceyes_graph import create_speceyes_graph
from speceyes_graph.demo.example import make_example_models, make_example_scenes


class AppState(TypedDict, total=False):
    messages: Annotated[list, add_messages]
    question: str
    images: list[str]
    options: list[str] | None
    answer: str | None
    route: str | None


judge, speculator, agent = make_example_models()
speceyes = create_speceyes_graph(judge=judge, speculator=speculator, agent=agent).compile()
text_model = FakeListChatModel(responses=["Paris is the capital of France."])


def intake(state: AppState) -> dict:
    return {"question": state["messages"][-1].content}


def pick(state: AppState) -> Literal["speceyes", "chat"]:
    return "speceyes" if state.get("images") else "chat"


def chat(state: AppState) -> dict:
    reply = text_model.invoke(state["messages"])
    return {"answer": reply.content, "route": "text-model", "messages": [reply]}


def respond(state: AppState) -> dict:
    return {"messages": [AIMessage(content=f"{state['answer']} (via {state['route']})")]}


app = StateGraph(AppState)
app.add_node("intake", intake)
app.add_node("speceyes", speceyes)
app.add_node("chat", chat)
app.add_node("respond", respond)
app.add_edge(START, "intake")
app.add_conditional_edges("intake", pick, ["speceyes", "chat"])
app.add_edge("speceyes", "respond")
app.add_edge("respond", END)
app.add_edge("chat", END)
app = app.compile()

scenes = make_example_scenes(Path(tempfile.mkdtemp()))
for text, images, options in [
    ("What is the capital of France?", [], None),
    (scenes[0]["question"], scenes[0]["images"], scenes[0]["options"]),
    (scenes[2]["question"], scenes[2]["images"], scenes[2]["options"]),
]:
    out = app.invoke(
        {"messages": [HumanMessage(content=text)], "images": images, "options": options}
    )
    print(
        f"{text[:52]:<54} -> route={out['route']:<16} answer={out['answer']!r:<36} messages={len(out['messages'])}"
    )
