"""Model specs on the command line: one string names where a model comes from.

- ``demo``: the checkpoints shipped in the package (use it for both models: they were trained
  together on their own prompts, which the graph then uses);
- ``tiny:DIR``: a ``speceyes make-tiny-models`` folder (``DIR/small`` or ``DIR/large``);
- ``openai:BASE_URL#MODEL_NAME``: an OpenAI-compatible server (vLLM, SGLang); the image size
  limits and context length are asked of the server (see :mod:`.served`: the checkpoint it
  loaded, else the model's family), or set by ``?min_pixels=..&max_pixels=..`` after the name;
- a local checkpoint folder, or a hub id (checked before loading: an id that is neither cached
  nor reachable fails at once instead of after minutes of retries).
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from speceyes_tools.images import ResizeSpec

from .families import family_resize
from .hub import HUB_ID, hub_problem

__all__ = ["ModelSpec", "SpecError", "load_chat_model", "parse_model_spec"]


class SpecError(ValueError):
    """A model spec that cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # demo | tiny | openai | path | hub
    target: str  # folder, hub id, or base URL
    name: str | None = None  # served model name (openai)
    resize: ResizeSpec | None = None  # explicit image limits for a served model


def parse_model_spec(spec: str, role: str, *, check_hub: bool = True) -> ModelSpec:
    """Parse and check a spec up front, with a message a user can act on."""
    if not spec:
        raise SpecError(f"no {role} model given")
    if spec == "demo":
        return ModelSpec("demo", role)
    if spec.startswith("tiny:"):
        folder = Path(spec[len("tiny:") :]) / role
        if not (folder / "config.json").exists():
            raise SpecError(
                f"{folder} is not a tiny checkpoint; build them with `speceyes make-tiny-models DIR`"
            )
        return ModelSpec("tiny", str(folder))
    if spec.startswith("openai:"):
        url, _, rest = spec[len("openai:") :].partition("#")
        name, _, query = rest.partition("?")
        if not url.startswith(("http://", "https://")) or not name:
            raise SpecError(
                f"write openai:BASE_URL#MODEL_NAME (e.g. openai:http://host:8001/v1#Qwen/Qwen3-VL-2B-Instruct), got {spec!r}"
            )
        resize = None  # asked of the server when the client is built (see .served)
        if query:
            family = family_resize(name)
            limits = dict(urllib.parse.parse_qsl(query))
            unknown = set(limits) - {"min_pixels", "max_pixels"}
            if unknown:
                raise SpecError(
                    f"unknown settings {sorted(unknown)} in {spec!r}; use min_pixels, max_pixels"
                )
            try:
                resize = dataclasses.replace(
                    family,
                    min_pixels=int(limits.get("min_pixels", family.min_pixels)),
                    max_pixels=int(limits.get("max_pixels", family.max_pixels)),
                )
            except ValueError:
                raise SpecError(f"min_pixels and max_pixels must be integers in {spec!r}") from None
        return ModelSpec("openai", url, name, resize)
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise SpecError(f"{path} has no config.json: not a checkpoint folder")
        return ModelSpec("path", str(path))
    if not HUB_ID.match(spec):
        raise SpecError(
            f"{spec!r} is neither a folder, a hub id (owner/name), demo, tiny:DIR nor openai:URL#NAME"
        )
    if check_hub:
        _check_hub(spec)
    return ModelSpec("hub", spec)


def _check_hub(repo_id: str) -> None:
    """Fail fast when a hub id is not cached and cannot be downloaded."""
    problem = hub_problem(repo_id)
    if problem:
        raise SpecError(problem)


def load_chat_model(
    spec: ModelSpec,
    *,
    top_logprobs: int | None,
    max_new_tokens: int,
    batch_size: int,
    max_batch_tokens: int | Literal["auto"] | None = "auto",
) -> Any:
    """The chat model a checked spec names (``max_batch_tokens``: local models only; a
    server batches by its own rules)."""
    if spec.kind == "openai":
        from .openai_compat import openai_chat_model

        assert spec.name is not None  # parse_model_spec names the served model
        return openai_chat_model(
            spec.target,
            spec.name,
            top_logprobs=top_logprobs,
            max_tokens=max_new_tokens,
            resize=spec.resize,
        )
    from .chat_transformers import ChatTransformersVLM

    if spec.kind == "demo":  # models/ sits below demo/: the caller knows where they are
        raise SpecError(
            "a demo spec names the shipped checkpoints: load ModelSpec('path', "
            "str(speceyes_graph.demo.demo_checkpoints()[role])) instead"
        )
    return ChatTransformersVLM(
        model=spec.target,
        top_logprobs=top_logprobs,
        max_tokens=max_new_tokens,  # the field's alias (its name works too: populate_by_name)
        max_batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
    )
