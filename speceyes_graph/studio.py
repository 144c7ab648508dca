"""The graph LangGraph Studio / ``langgraph dev`` opens (see ``langgraph.json``).

Models come from the environment, so the same file serves a laptop and a cluster:

- ``SPECEYES_SMALL_URL``, ``SPECEYES_SMALL_MODEL``, ``SPECEYES_LARGE_URL``,
  ``SPECEYES_LARGE_MODEL``: OpenAI-compatible servers (vLLM / SGLang);
- else ``SPECEYES_SMALL_PATH`` and ``SPECEYES_LARGE_PATH``: local checkpoints
  (transformers);
- else the offline example's scripted models, so Studio opens with no setup at all.

``SPECEYES_TAU``, ``SPECEYES_TOP_K`` and ``SPECEYES_TOOLS`` tune the gate and the toolset.
Imports are absolute because the LangGraph CLI loads this file by path.
"""

from __future__ import annotations

import os

from speceyes_graph.graph import create_speceyes_graph
from speceyes_graph.separability import GateConfig


def make_graph():
    env = os.environ.get
    gate = GateConfig(tau=float(env("SPECEYES_TAU", "0.98")), k=int(env("SPECEYES_TOP_K", "64")))
    tools = env("SPECEYES_TOOLS", "deepeyes")
    if env("SPECEYES_SMALL_URL") and env("SPECEYES_LARGE_URL"):
        from speceyes_graph.serving import openai_models

        models = openai_models(
            env("SPECEYES_SMALL_URL"),
            env("SPECEYES_SMALL_MODEL", "small"),
            env("SPECEYES_LARGE_URL"),
            env("SPECEYES_LARGE_MODEL", "large"),
            top_logprobs=gate.k,
        )
    elif env("SPECEYES_SMALL_PATH") and env("SPECEYES_LARGE_PATH"):
        from speceyes_graph.models import ChatTransformersVLM

        models = {
            "speculator": ChatTransformersVLM(
                model=env("SPECEYES_SMALL_PATH"), top_logprobs=gate.k, max_new_tokens=20
            ),
            "agent": ChatTransformersVLM(model=env("SPECEYES_LARGE_PATH")),
        }
    else:
        from speceyes_graph.example import make_example_models

        judge, speculator, agent = make_example_models()
        models = {"judge": judge, "speculator": speculator, "agent": agent}
    return create_speceyes_graph(**models, gate=gate, tools=tools).compile(name="speceyes")


graph = make_graph()
