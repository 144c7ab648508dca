"""Streaming: watch each query's route being decided, node by node, as it happens.

``stream_mode="updates"`` shows the judge, the draft and the gate; the agent loop reports
each model turn (tool calls, answer) as a ``custom`` event while it runs.
"""

import tempfile
from pathlib import Path

from speceyes_graph import create_speceyes_graph
from speceyes_graph.demo.example import make_example_models, make_example_scenes

judge, speculator, agent = make_example_models()
graph = create_speceyes_graph(judge=judge, speculator=speculator, agent=agent).compile()

for scene in make_example_scenes(Path(tempfile.mkdtemp()))[2:4]:
    print(f"== {scene['query_id']}: {scene['question']}")
    inputs = {k: scene[k] for k in ("question", "images", "options")}
    for namespace, mode, data in graph.stream(
        inputs, stream_mode=["updates", "custom"], subgraphs=True
    ):
        if mode == "custom" and "agent_step" in data:
            step = data["agent_step"]
            calls = [f"{c['name']}({c['arguments']})" for c in step["tool_calls"]]
            print(
                f"  agent step {step['step']}: "
                + (f"calls {', '.join(calls)}" if calls else f"answers {step['answer']!r}")
            )
            continue
        if mode != "updates" or namespace:
            continue
        for node, values in data.items():
            if node == "judge":
                print(
                    f"  judge: {values['judge_output']!r} -> {'agent loop' if values['route'] == 'judged-agentic' else 'speculate'}"
                )
            elif node == "speculate":
                print(
                    f"  draft: {values['draft']['text']!r}, acceptance score {values['draft']['score']:.4f}"
                )
            elif node == "gate":
                print(f"  gate: route {values['route']}")
            elif node == "agent_loop":
                print(
                    f"  agent loop: answer {values['answer']!r} after {len(values['agent_steps'])} steps ({values['stop_reason']})"
                )
