"""SpecEyes for your existing agent in three lines: ``SpecEyesMiddleware`` in ``create_agent``.

Your agent is LangChain's ``create_agent`` over a vision model and its tools. Give it
``SpecEyesMiddleware`` with a small model: on each human turn the agent's own model judges
whether tools would help; if not, the small model answers, and its answer is the agent's
reply when it clears the gate (no agent call, no tool). Everything else reaches your agent
exactly as before. Runs offline on the demo checkpoints shipped in the package.

The demo's large checkpoint was trained on DeepEyes' text protocol, not on native tool calls,
so as a ``create_agent`` agent it answers the zoom questions poorly; with your own model the
agent's answers are your agent's. What the example shows is the split: which turns SpecEyes
answers, and the time the agent is spared.
"""

import base64
import tempfile
import time
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

from speceyes_graph import SpecEyesMiddleware
from speceyes_graph.agents.toolsets import build_tools, load_toolset
from speceyes_graph.demo import DEMO_PROMPTS, demo_models, demo_queries

models = demo_models()  # two tiny Qwen-VL checkpoints (ChatTransformersVLM), no download
small, large = models["small"], models["large"]
tools = build_tools(load_toolset("deepeyes"), resize=large.resize_spec)  # zoom, in its frame
system = DEMO_PROMPTS.agent_system  # the prompt the demo agent learned

# your agent, as it is
agent = create_agent(large, tools, system_prompt=system)

# the same agent with SpecEyes in front: three lines
speceyes = SpecEyesMiddleware(speculator=small, prompts=DEMO_PROMPTS)
agent_with_speceyes = create_agent(large, tools, system_prompt=system, middleware=[speceyes])


def user_turn(q) -> dict:
    """A question as a user sends it: the image pasted, the question with its options."""
    data = base64.b64encode(Path(q.image).read_bytes()).decode()
    text = DEMO_PROMPTS.question(q.question, q.options)
    image = {"type": "image", "base64": data, "mime_type": "image/png"}
    return {"messages": [HumanMessage(content=[image, {"type": "text", "text": text}])]}


queries = demo_queries(Path(tempfile.mkdtemp()), 12, seed=1)
turns = [user_turn(q) for q in queries]
agent.batch(turns[:2])  # warm up both models' first calls
t0 = time.perf_counter()
alone = agent.batch(turns, {"max_concurrency": 12})
t1 = time.perf_counter()
with_speceyes = agent_with_speceyes.batch(turns, {"max_concurrency": 12})
t2 = time.perf_counter()

for q, out in zip(queries, with_speceyes, strict=True):
    record, reply = out["speceyes"], out["messages"][-1]
    score = (record.get("draft") or {}).get("score")
    print(
        f"{q.id} {q.split:<10} expected={q.meta['answer_text']:<7} route={record['route']:<17} "
        f"score={'-' if score is None else f'{score:.3f}'} reply={str(reply.content)[:40]!r}"
    )
answered = sum(out["speceyes"]["route"] == "speculative" for out in with_speceyes)
print(f"SpecEyes answered {answered} of {len(queries)} turns without the agent's loop")
print(f"agent alone {t1 - t0:.1f} s, with SpecEyes {t2 - t1:.1f} s")
