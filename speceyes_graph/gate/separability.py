"""Answer separability: the confidence gate of SpecEyes (arXiv 2603.23483, phase III).

For every generated token with top-K logits ``l1 >= l2 >= ... >= lK``::

    S = (l1 - mean(l2..lK)) / (std(l2..lK) + 1e-6)      # population std, top-1 excluded

The answer's score aggregates ``S`` over its tokens (``min`` by default: one unsure token
rejects the whole answer), the published acceptance score is ``sigmoid(0.6 * aggregate)``,
and a draft is accepted when that score is *strictly* greater than tau.

``S`` is invariant to adding a constant to every logit of a step, so the top-K
*log-probabilities* a serving engine returns (log-softmax = logits minus a per-step
constant) give exactly the score raw logits give. Both entry points live here.

Note a property of the published score, kept as published: it compares the top-1 logit
with the *bulk* of the top-K, not with the runner-up, so a two-way tie far above all other
candidates still scores high (tested in ``test_ties``).

Only the answer's own tokens are scored, as in the published evaluation (which stops before
end-of-sequence): a serving engine's ``logprobs.content`` ends with the end-of-turn token
when generation stopped on it (vLLM returns ``<|im_end|>`` there), and that entry is dropped
(:data:`END_OF_TURN_TOKENS`), so a draft scores the same tokens over HTTP as on the
transformers path, which cuts its reply at the first end-of-sequence token.

Inputs are validated rather than trusted: non-finite values raise
:class:`SeparabilityError` (a NaN must never turn into an accepted draft), and asking for
more competitors than exist raises unless ``clamp=True`` is passed explicitly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from ..state import Draft

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_K",
    "DEFAULT_TAU",
    "END_OF_TURN_TOKENS",
    "EPS",
    "Aggregation",
    "GateConfig",
    "SeparabilityError",
    "acceptance_score",
    "aggregate",
    "answer_separability",
    "answer_separability_from_logprobs",
    "answer_span",
    "is_accepted",
    "softmax_confidence",
    "softmax_confidence_from_logprobs",
    "sorted_separability",
    "token_separability",
    "token_separability_from_logprobs",
    "top_logprob_values",
]

DEFAULT_K = 64
DEFAULT_TAU = 0.98
DEFAULT_ALPHA = 0.6
DEFAULT_BOTTOM_Q = 0.2
EPS = 1e-6

Aggregation = Literal["min", "mean", "bottom-q"]

# End-of-turn / end-of-sequence tokens of the usual chat templates (Qwen, Llama 3, Gemma,
# Phi, SentencePiece models), as a server names them in ``logprobs.content``.
END_OF_TURN_TOKENS = frozenset(
    {"<|im_end|>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>",
     "<|end|>", "<end_of_turn>", "</s>"}
)  # fmt: skip


class SeparabilityError(ValueError):
    """The scores cannot be computed honestly from this input."""


def _as_float_matrix(logits: Any, k: int, clamp: bool) -> tuple[np.ndarray, int]:
    """Top-k values per row, sorted descending, as float64 numpy (works for torch too).

    torch tensors are reduced with ``topk`` on their own device, so a ``[n, 150k]`` GPU
    tensor never crosses to the CPU whole; float16/bfloat16 are widened first.
    """
    if k < 2:
        raise SeparabilityError(f"k must be at least 2 (top-1 plus one competitor), got {k}")
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        have_torch = False
    else:
        have_torch = True
    if have_torch and isinstance(logits, torch.Tensor):
        t = logits.detach()
        if t.ndim == 1:
            t = t.unsqueeze(0)
        if t.ndim != 2:
            raise SeparabilityError(f"logits must be [n_tokens, vocab], got shape {tuple(t.shape)}")
        t = t.float()
        if torch.isnan(t).any():
            raise SeparabilityError("logits contain NaN")
        k_eff = _check_k(k, t.shape[1], clamp)
        top = (
            torch.topk(t, k_eff, dim=-1).values.cpu().double().numpy()
            if t.shape[0]
            else np.zeros((0, k_eff))
        )
    else:
        a = np.asarray(logits, dtype=np.float64)
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2:
            raise SeparabilityError(f"logits must be [n_tokens, vocab], got shape {a.shape}")
        if np.isnan(a).any():
            raise SeparabilityError("logits contain NaN")
        k_eff = _check_k(k, a.shape[1], clamp)
        top = -np.sort(
            -np.partition(a, a.shape[1] - k_eff, axis=1)[:, a.shape[1] - k_eff :], axis=1
        )
    if not np.isfinite(top).all():
        raise SeparabilityError(
            "top-K logits contain +/-inf (masked or overflowed logits); the score is undefined"
        )
    return top, k_eff


def _check_k(k: int, available: int, clamp: bool) -> int:
    if available >= k:
        return k
    if clamp and available >= 2:
        return available
    raise SeparabilityError(
        f"asked for top-{k} but only {available} values per token are available; "
        "lower k, or pass clamp=True to use what is there"
    )


def sorted_separability(top: np.ndarray) -> np.ndarray:
    """Per-token S of a (tokens, K) matrix sorted descending: logits or log-probs alike."""
    competitors = top[:, 1:]
    # numpy types an untyped ndarray's slices as Any: the result is a (tokens,) array
    per_token: np.ndarray = (top[:, 0] - competitors.mean(axis=1)) / (competitors.std(axis=1) + EPS)
    return per_token


def token_separability(logits: Any, k: int = DEFAULT_K, *, clamp: bool = False) -> np.ndarray:
    """One separability score per row of a ``[n_tokens, vocab]`` tensor or array."""
    top, _ = _as_float_matrix(logits, k, clamp)
    return sorted_separability(top)


def aggregate(
    scores: Sequence[float] | np.ndarray,
    aggregation: Aggregation = "min",
    *,
    q: float = DEFAULT_BOTTOM_Q,
) -> float:
    """Reduce per-token scores to one answer score (``min``, ``mean`` or ``bottom-q``)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if s.size == 0:
        raise SeparabilityError("empty answer: no generated tokens to score")
    if not np.isfinite(s).all():
        raise SeparabilityError("token scores contain NaN or inf")
    if aggregation == "min":
        return float(s.min())
    if aggregation == "mean":
        return float(s.mean())
    if aggregation == "bottom-q":
        if not 0 < q <= 1:
            raise SeparabilityError(f"bottom-q needs 0 < q <= 1, got {q}")
        n = max(1, int(math.floor(q * s.size)))
        return float(np.sort(s)[:n].mean())
    raise SeparabilityError(f"unknown aggregation {aggregation!r}; use 'min', 'mean' or 'bottom-q'")


def answer_separability(
    logits: Any,
    k: int = DEFAULT_K,
    aggregation: Aggregation = "min",
    *,
    q: float = DEFAULT_BOTTOM_Q,
    clamp: bool = False,
) -> float:
    """The raw (pre-sigmoid) separability of a whole answer from its per-token logits."""
    return aggregate(token_separability(logits, k, clamp=clamp), aggregation, q=q)


def acceptance_score(raw: float, alpha: float = DEFAULT_ALPHA) -> float:
    """The published acceptance score ``sigmoid(alpha * raw)``, numerically stable."""
    x = alpha * float(raw)
    if math.isnan(x):
        raise SeparabilityError("separability is NaN")
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def separability_of(score: float, alpha: float = DEFAULT_ALPHA) -> float:
    """The separability whose acceptance score is ``score``: the inverse of
    :func:`acceptance_score`, for taus and scores kept on the acceptance scale (0 and 1
    clamped to stay finite)."""
    p = min(max(float(score), 1e-16), 1 - 1e-16)
    return math.log(p / (1 - p)) / alpha


def is_accepted(score: float, tau: float = DEFAULT_TAU) -> bool:
    """Accept strictly above tau, as the official code does (exactly tau is rejected)."""
    return bool(score > tau)


# --- top-K log-probabilities (OpenAI / vLLM / SGLang format) -------------------------------


def top_logprob_values(token_entry: Any) -> list[float]:
    """The top log-prob values of one generated token, from any of the usual shapes.

    Accepts an OpenAI ``logprobs.content[i]`` entry (``{"token", "logprob",
    "top_logprobs": [{"token", "logprob"}, ...]}``), the bare ``top_logprobs`` list, a
    ``{token: logprob}`` mapping (legacy completions format) or a list of floats.
    """
    entry = token_entry
    if isinstance(entry, Mapping) and "top_logprobs" in entry:
        entry = entry["top_logprobs"]
        if entry is None:
            raise SeparabilityError("token entry has top_logprobs=None (request top_logprobs=K)")
    elif hasattr(entry, "top_logprobs"):  # pydantic objects from the openai client
        entry = entry.top_logprobs
    if entry is None or isinstance(entry, (str, bytes, int, float)):
        raise SeparabilityError(f"malformed top_logprobs entry: {token_entry!r:.80}")
    try:
        if isinstance(entry, Mapping):
            values = list(entry.values())
        else:
            values = [  # plain dicts first: an ABC isinstance per value costs ms per draft
                e["logprob"]
                if type(e) is dict
                else (e["logprob"] if isinstance(e, Mapping) else getattr(e, "logprob", e))
                for e in entry
            ]
        return [float(v) for v in values]
    except (TypeError, ValueError, KeyError) as exc:
        raise SeparabilityError(f"malformed top_logprobs entry: {token_entry!r:.80}") from exc


def _logprob_matrix(
    top_logprobs: Any, k: int, clamp: bool, rows: list[list[float]] | None = None
) -> np.ndarray:
    if rows is None:
        rows = [top_logprob_values(entry) for entry in _content(top_logprobs)]
    if not rows:
        raise SeparabilityError("empty answer: no generated tokens to score")
    available = min(len(r) for r in rows)
    if available < k and not (clamp and available >= 2):
        raise SeparabilityError(
            f"the server returned only {available} top log-probs for some token but k={k}: "
            f"start it with a higher cap (vLLM: --max-logprobs {k}) and request "
            f"top_logprobs={k}, or pass clamp=True to score with fewer competitors"
        )
    k_eff = min(k, available)
    top = np.array([sorted(r, reverse=True)[:k_eff] for r in rows], dtype=np.float64)
    if np.isnan(top).any() or np.isposinf(top).any():
        raise SeparabilityError("top log-probs contain NaN or +inf")
    if np.isneginf(top).any():
        raise SeparabilityError(
            "top log-probs contain -inf (fewer than k tokens have non-zero probability); "
            "the score is undefined at this k"
        )
    return top


def token_separability_from_logprobs(
    top_logprobs: Any, k: int = DEFAULT_K, *, clamp: bool = False
) -> np.ndarray:
    """Per-token separability from top-K log-probs (identical to the raw-logit score)."""
    return sorted_separability(_logprob_matrix(top_logprobs, k, clamp))


def answer_separability_from_logprobs(
    top_logprobs: Any,
    k: int = DEFAULT_K,
    aggregation: Aggregation = "min",
    *,
    q: float = DEFAULT_BOTTOM_Q,
    clamp: bool = False,
) -> float:
    """Raw answer separability from ``logprobs.content`` (a list of token entries)."""
    return aggregate(
        token_separability_from_logprobs(top_logprobs, k, clamp=clamp), aggregation, q=q
    )


# --- softmax baseline (ablation) ------------------------------------------------------------


def softmax_confidence(logits: Any) -> float:
    """Geometric mean over tokens of the max softmax probability (the paper's baseline)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        have_torch = False
    else:
        have_torch = True
    if have_torch and isinstance(logits, torch.Tensor):
        t = logits.detach().float()
        t = t.unsqueeze(0) if t.ndim == 1 else t
        if t.shape[0] == 0:
            raise SeparabilityError("empty answer: no generated tokens to score")
        if torch.isnan(t).any():
            raise SeparabilityError("logits contain NaN")
        log_pmax = torch.log_softmax(t, dim=-1).max(dim=-1).values.double().cpu().numpy()
    else:
        a = np.asarray(logits, dtype=np.float64)
        a = a[None, :] if a.ndim == 1 else a
        if a.shape[0] == 0:
            raise SeparabilityError("empty answer: no generated tokens to score")
        if np.isnan(a).any():
            raise SeparabilityError("logits contain NaN")
        m = a.max(axis=1, keepdims=True)
        log_pmax = -np.log(np.exp(a - m).sum(axis=1))
    if not np.isfinite(log_pmax).all():
        raise SeparabilityError("softmax confidence is undefined for these logits")
    return float(np.exp(log_pmax.mean()))


def softmax_confidence_from_logprobs(top_logprobs: Any) -> float:
    """The same baseline from served log-probs: the top-1 log-prob is log max softmax."""
    rows = [top_logprob_values(e) for e in _content(top_logprobs)]
    if not rows or any(not r for r in rows):
        raise SeparabilityError("empty answer: no generated tokens to score")
    firsts = np.array([max(r) for r in rows], dtype=np.float64)
    if not np.isfinite(firsts).all():
        raise SeparabilityError("top log-probs contain NaN or inf")
    return float(np.exp(firsts.mean()))


def _content(top_logprobs: Any) -> Sequence[Any]:
    """The answer's per-token entries of OpenAI-format ``logprobs`` (or the list itself),
    without a trailing end-of-turn token."""
    content = top_logprobs.get("content") if isinstance(top_logprobs, Mapping) else top_logprobs
    if content is None:
        return []
    if isinstance(content, (str, bytes)) or not isinstance(content, Sequence):
        raise SeparabilityError(
            f"malformed logprobs: expected a list of tokens, got {content!r:.80}"
        )
    end = len(content)
    while end and _token_of(content[end - 1]) in END_OF_TURN_TOKENS:
        end -= 1
    return content if end == len(content) else content[:end]


def answer_span(logprobs: Any, open_tag: str = "<answer>", close_tag: str = "</answer>") -> Any:
    """Only the tokens of the final answer (those overlapping the text between the last
    ``<answer>`` and its ``</answer>``), as OpenAI-format ``logprobs``.

    An agent turn is mostly reasoning and tool syntax; gating its minimum over every token
    would judge the think text, not the answer. Without the tags in the tokens (a native
    tool-calling reply, a tokenizer whose pieces do not spell the text) every token is kept:
    more tokens under ``min`` can only lower the score, so the fallback is the cautious one.
    """
    content = _content(logprobs)
    pieces = [_token_of(e) or "" for e in content]
    text = "".join(pieces)
    opened = text.rfind(open_tag)
    if opened < 0:
        return logprobs
    start = opened + len(open_tag)
    closed = text.find(close_tag, start)
    end = len(text) if closed < 0 else closed
    kept, at = [], 0
    for entry, piece in zip(content, pieces, strict=True):
        if at < end and at + len(piece) > start and piece.strip():
            kept.append(entry)
        at += len(piece)
    return {"content": kept}


def _token_of(entry: Any) -> str | None:
    token = entry.get("token") if isinstance(entry, Mapping) else getattr(entry, "token", None)
    return token if isinstance(token, str) else None


# --- the gate as a configured decision ------------------------------------------------------


class GateConfig:
    """Published defaults: K 64, ``min`` aggregation, ``sigmoid(0.6 * S)`` strictly above 0.98.

    ``score="softmax"`` swaps in the softmax-confidence baseline (the paper's ablation);
    ``clamp=True`` scores with fewer competitors when a server returns fewer than K
    log-probs (recorded in the draft) instead of failing the draft.
    """

    def __init__(
        self,
        tau: float = DEFAULT_TAU,
        k: int = DEFAULT_K,
        aggregation: Aggregation = "min",
        alpha: float = DEFAULT_ALPHA,
        q: float = DEFAULT_BOTTOM_Q,
        score: Literal["separability", "softmax"] = "separability",
        clamp: bool = False,
        tau_depth: float | None = None,
    ):
        if aggregation not in ("min", "mean", "bottom-q"):
            raise ValueError(
                f"unknown aggregation {aggregation!r}; use 'min', 'mean' or 'bottom-q'"
            )
        if score not in ("separability", "softmax"):
            raise ValueError(f"unknown score {score!r}; use 'separability' or 'softmax'")
        if k < 2:
            raise ValueError(f"k must be at least 2, got {k}")
        self.tau, self.k, self.aggregation, self.alpha, self.q = tau, k, aggregation, alpha, q
        self.score, self.clamp = score, clamp
        self.tau_depth = tau_depth  # None: the tool-free tau (see `after_tools`)

    @classmethod
    def load(cls, path: str | Path) -> GateConfig:
        """A gate file written by ``speceyes calibrate`` (or ``{"tau": .., "k": .., ...}``)."""
        data = json.loads(Path(path).read_text())
        data = data.get("gate", data)
        if "tau" not in data:
            raise ValueError(f"{path} is not a gate file (no tau)")
        keys = ("tau", "k", "aggregation", "alpha", "q", "score", "clamp", "tau_depth")
        return cls(**{k: data[k] for k in keys if k in data})

    def replace(self, **changes: Any) -> GateConfig:
        """A copy with some settings changed (per-run overrides)."""
        settings = {
            "tau": self.tau,
            "k": self.k,
            "aggregation": self.aggregation,
            "alpha": self.alpha,
            "q": self.q,
            "score": self.score,
            "clamp": self.clamp,
            "tau_depth": self.tau_depth,
        }
        return GateConfig(**{**settings, **changes})

    def after_tools(self) -> GateConfig:
        """The gate of an answer the small model gave after its own tool steps (depth-D
        speculation): the same score with ``tau_depth``, or tau when none was set. Its own
        threshold, because an answer conditioned on a crop is scored on different evidence."""
        return self.replace(tau=self.tau if self.tau_depth is None else self.tau_depth)

    def __repr__(self) -> str:
        return (
            f"GateConfig(tau={self.tau}, k={self.k}, aggregation={self.aggregation!r}, "
            f"alpha={self.alpha}, score={self.score!r}"
            + (f", tau_depth={self.tau_depth}" if self.tau_depth is not None else "")
            + ")"
        )

    def decide(self, logprobs: Any) -> Draft:
        """:meth:`evaluate` for untrusted log-probs: a missing or malformed shape becomes a
        recorded rejection (``accepted`` False, ``error`` saying why), never an exception."""
        if not logprobs:
            return {
                "accepted": False,
                "error": "the speculator returned no logprobs: ask for them (ChatOpenAI("
                "logprobs=True, top_logprobs=K) or ChatTransformersVLM(top_logprobs=K))",
            }
        try:
            return self.evaluate(logprobs)
        except Exception as exc:
            return {"accepted": False, "error": f"gate: {type(exc).__name__}: {exc}"}

    def evaluate(self, logprobs: Any) -> Draft:
        """Score a draft from its OpenAI-format ``logprobs`` and decide acceptance.

        Returns the :class:`~speceyes_graph.state.Draft` fields; raises
        :class:`SeparabilityError` when no honest score exists (the caller rejects).
        """
        content = _content(logprobs)
        if not content:
            raise SeparabilityError("empty answer: no generated tokens to score")
        rows = [top_logprob_values(e) for e in content]
        top = _logprob_matrix(content, self.k, self.clamp, rows)
        token_scores = sorted_separability(top)
        separability = aggregate(token_scores, self.aggregation, q=self.q)
        confidence = float(np.exp(np.mean([max(r) for r in rows])))
        score = (
            acceptance_score(separability, self.alpha)
            if self.score == "separability"
            else confidence
        )
        tokens = [_token_of(e) or "" for e in content]
        return {
            "tokens": tokens,
            "token_scores": [float(s) for s in token_scores],
            "top_logprobs": [[float(v) for v in row] for row in top],
            "separability": separability,
            "softmax_confidence": confidence,
            "score": score,
            "accepted": is_accepted(score, self.tau),
            "note": None
            if top.shape[1] == self.k
            else f"scored with top-{top.shape[1]} (clamped from {self.k})",
        }
