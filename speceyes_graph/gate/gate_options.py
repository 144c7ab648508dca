"""How an :class:`~speceyes_graph.gate.online.OnlineGate` is configured, by concern.

Besides its target (``max_risk``), its shadow policy and where it starts (``config``,
``evidence``, ``tau``), a gate takes three groups of settings, each a small frozen
dataclass that checks its own values when it is made:

- ``risk``: the window the risk target is held on (:class:`RiskOptions`);
- ``labels``: the shadow runs that label accepted drafts (:class:`LabelOptions`);
- ``trust``: where the observations live and when the gate does not trust them
  (:class:`TrustOptions`).

``OnlineGate(0.02, risk=RiskOptions(window=2000), trust=TrustOptions(namespace="x"))``.
Checks that need the target too (the warm-up's default and its range) are the gate's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from langgraph.store.base import BaseStore

__all__ = ["DEFAULT_WINDOW", "LabelOptions", "RiskOptions", "TrustOptions"]

DEFAULT_WINDOW = 1000
"""How many recent queries a gate's window holds unless told otherwise (measured beside
the shadow policy: docs/calibration.md)."""


@dataclass(frozen=True)
class RiskOptions:
    """The window the risk target is held on, and how tau is chosen from it.

    Attributes:
        tolerance: the window's exact bound (at level ``delta``) must stay at or below
            ``tolerance * max_risk`` too.
        delta: the level of each window's bound.
        window: how many recent queries the estimate uses.
        warmup: queries in the window (evidence included) before tau moves from where it
            started; default ``ceil(ln(1/delta) / max_risk)``, the fewest in which a bound
            at level ``delta`` can reach ``max_risk`` at all.
        taus: the candidate taus (default
            :func:`~speceyes_graph.gate.online.default_taus`).
        rolling_step: None (default): tau is the window's certified one. A number: rolling
            risk control instead (:mod:`~speceyes_graph.gate.rolling`, the long-run
            alternative), moving this many candidates per unit of loss, from where the
            window (its evidence) puts tau; each worker moves its own.
        max_age_s: observations older than this do not count (default a week; None: no
            limit).
    """

    tolerance: float = 1.5
    delta: float = 0.1
    window: int = DEFAULT_WINDOW
    warmup: int | None = None
    taus: Sequence[float] | None = None
    rolling_step: float | None = None
    max_age_s: float | None = 7 * 86400.0

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if not self.tolerance >= 1:
            raise ValueError(f"tolerance must be at least 1, got {self.tolerance}")
        if self.window < 2:
            raise ValueError(f"window must be at least 2, got {self.window}")
        if self.max_age_s is not None and not self.max_age_s > 0:
            raise ValueError(f"max_age_s must be positive or None, got {self.max_age_s}")


@dataclass(frozen=True)
class LabelOptions:
    """The shadow runs that label accepted drafts, off the user's path
    (:class:`~speceyes_graph.gate.shadowing.ShadowRuns`), and when their labels count.

    Attributes:
        concurrency: shadow runs at once.
        queue: shadow runs waiting; past that a shadow is dropped (its label lost).
        patience_s: the window counts the traffic up to the oldest shadow run still under
            way, so that slow labels do not tighten it; a shadow in flight longer than this
            holds nothing back (and never counts).
        stretch: how many of this worker's last shadows the label flow is judged on
            (:class:`~speceyes_graph.gate.shadowing.LabelFlow`).
        loss: more than this share of them giving no label (their runs failed, or they
            were dropped while no run labelled for a minute) is trouble: tau at least
            ``outage_tau`` (:class:`TrustOptions`) until probes show labels flow again.
        seed: for the shadow draws (None: random).
    """

    concurrency: int = 2
    queue: int = 64
    patience_s: float = 300.0
    stretch: int = 10
    loss: float = 0.5
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.patience_s > 0:
            raise ValueError(f"patience_s must be positive, got {self.patience_s}")


@dataclass(frozen=True)
class TrustOptions:
    """Where the observations live, whose entries count, and what the gate does when it
    cannot vouch for them: it trusts only what it wrote, and fails safe.

    Attributes:
        key: the secret that signs the gate's entries in a shared store, the same on every
            worker (a list: the first signs, all verify, for rotation); default
            ``SPECEYES_GATE_KEY``. Without one a gate refuses a shared store.
        store: where the observations live. ``"run"`` (default): the run's LangGraph store
            when the graph has one (``langgraph dev``, Aegra, LangGraph Platform, or
            ``compile(store=...)``), so every worker shares one gate; else this process's
            memory. None: always this process's memory. A ``BaseStore``: that store.
        namespace: the gate's name in the store (one per gate of a deployment).
        sync_s: how often a worker reads the other workers' observations.
        outage_tau: the least tau while the fleet's labels cannot be written or read, or
            have not been read for a while (default the start tau; 1.0 accepts nothing).
        max_share: the most of the window any one source may hold (None: no cap). A
            source is a caller's identity on a server with identities; on an open server
            (every caller "anonymous"), the traffic of one ``burst_s`` stretch of time; in
            one process (no server run), nothing: never capped. A source's queries past
            its share replace its own oldest, so no one caller can crowd the others'
            evidence out or dilute it (docs/calibration.md, "Whose traffic").
        burst_s: the stretch of an open server's traffic counted as one source.
    """

    key: str | bytes | Sequence[str | bytes] | None = None
    store: BaseStore | Literal["run"] | None = "run"
    namespace: str = "default"
    sync_s: float = 1.0
    outage_tau: float | None = None
    max_share: float | None = 0.05
    burst_s: float = 60.0

    def __post_init__(self) -> None:
        if self.outage_tau is not None and not 0 <= self.outage_tau <= 1:
            raise ValueError(f"outage_tau must be in [0, 1], got {self.outage_tau}")
        if self.max_share is not None and not 0 < self.max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1] or None, got {self.max_share}")
        if not self.burst_s > 0:
            raise ValueError(f"burst_s must be positive, got {self.burst_s}")
