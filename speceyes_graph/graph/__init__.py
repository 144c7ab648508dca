"""The graph: SpecEyes' phases wired as a LangGraph ``StateGraph``.

``intake -> judge -> speculate -> gate -> (END | agent_loop)``. What each part holds:

- :mod:`.options`: every option of :func:`create_speceyes_graph` resolved and checked
  (:class:`~.options.GraphSetup`).
- :mod:`.nodes`: the nodes that run the phases (:mod:`speceyes_graph.phases`) on one query,
  and the routers between them.
- :mod:`.fallback` (phase IV: the built-in agent loop or any agent that speaks messages),
  :mod:`.specreason` (the SpecReason baseline), :mod:`.tool_speculation` (depth-D
  speculation), :mod:`.parallel_drafts` (drafts started while the judge runs): the nodes that
  run agents behind the gate.
- :mod:`.build`: the wiring, :func:`create_speceyes_graph`; :mod:`.drawing`: the picture.

May import: the vocabulary modules at the package's top (``state``, ``effects``,
``prompts``, ``protocol``, ``messages``, ``answers``, ``settings``, ``query``, ``phases``),
:mod:`speceyes_graph.models`, :mod:`speceyes_graph.gate` and :mod:`speceyes_graph.agents`;
never the integrations, the benchmarks, the demo or the CLI.
"""

from .build import (
    THYME_TAU,
    SpecEyesError,
    Speculation,
    SpeculationOptions,
    create_speceyes_graph,
    parse_judge,
    score_draft,
)

__all__ = [
    "THYME_TAU",
    "SpecEyesError",
    "Speculation",
    "SpeculationOptions",
    "create_speceyes_graph",
    "parse_judge",
    "score_draft",
]
