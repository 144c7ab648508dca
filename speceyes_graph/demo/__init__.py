"""The demo machinery, apart from the core graph.

- :mod:`.world`: the synthetic demo world (scenes, questions, the conversations trained on);
- :mod:`.training`: ``speceyes train-demo``, training the two demo checkpoints on a CPU;
- ``checkpoints/``: the shipped checkpoints (package data, ~17 MB);
- :mod:`.run`: ``speceyes demo``, SpecEyes against agent only on those checkpoints;
- :mod:`.tiny`: tiny random checkpoints of the real architectures, for tests;
- :mod:`.example`: ``speceyes example``, the graph with scripted stand-in models.
"""

from .run import (
    DEMO_GRAPH_SETTINGS,
    demo_checkpoints,
    demo_graph,
    demo_models,
    demo_queries,
    fixed_routes,
    run_demo,
)
from .world import DEMO_PROMPTS

__all__ = [
    "DEMO_GRAPH_SETTINGS",
    "DEMO_PROMPTS",
    "demo_checkpoints",
    "demo_graph",
    "demo_models",
    "demo_queries",
    "fixed_routes",
    "run_demo",
]
