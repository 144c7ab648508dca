"""The gate: whether a draft is kept (phase III), and how its threshold is chosen.

- :mod:`.separability`: answer separability from logits or served logprobs, the acceptance
  score, :class:`GateConfig` (tau, K, aggregation).
- :mod:`.calibration`: a tau from labelled queries (``speceyes calibrate``), the gate file;
  :mod:`.label_free`: a tau without labels; :mod:`.drift`: whether traffic moved.
- :mod:`.online`: :class:`OnlineGate`, tau from the labels production gives, with an exact
  bound, its settings grouped by concern (:mod:`.gate_options`: :class:`RiskOptions`,
  :class:`LabelOptions`, :class:`TrustOptions`); :mod:`.window` (the window's estimate,
  bound and certified tau), :mod:`.shadowing` (which accepted drafts the agent verifies),
  :mod:`.ledger` and :mod:`.keys` (the signed entries workers share through a store),
  :mod:`.online_steps` (the graph's and middleware's steps around it).

May import: the vocabulary modules at the package's top (``state``, ``effects``,
``prompts``, ``protocol``, ``answers``) and :mod:`speceyes_graph.models`; nothing that
builds a graph, an agent or an integration.
"""

from .online import LabelOptions, OnlineGate, RiskOptions, TrustOptions
from .separability import (
    GateConfig,
    SeparabilityError,
    acceptance_score,
    answer_separability,
    answer_separability_from_logprobs,
    token_separability,
)

__all__ = [
    "GateConfig",
    "LabelOptions",
    "OnlineGate",
    "RiskOptions",
    "SeparabilityError",
    "TrustOptions",
    "acceptance_score",
    "answer_separability",
    "answer_separability_from_logprobs",
    "token_separability",
]
