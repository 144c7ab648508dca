"""What a served model is, asked of the server before the first query.

A local checkpoint tells the graph how its processor resizes images and how long its context
is. A served one is only a name, and deployments name models as they like
(``--served-model-name small``), so guessing from the name sends a Qwen-VL model its images
at a megapixel instead of its family's 12.8. vLLM's ``/v1/models`` says which checkpoint it
loaded (``root``: a hub id or a folder; SGLang says it in ``/model_info``) and its context
length (``max_model_len``):

- the image frame comes from the checkpoint's own processor config when ``root`` is a folder
  this machine can read (the server is local, or shares the model store), else from the
  family of ``root``, else from the family of the served name; an explicit ``resize`` wins;
- the gate needs K top log-probs per token, and vLLM caps them at 20 unless started with
  ``--max-logprobs``: one one-token request finds out, so a server below K is reported before
  the run starts, with the flag to set, instead of every draft being rejected.

A server that cannot be reached yet (it may start after the graph) is not an error here: the
graph falls back to the name, and a missing log-prob is still caught per draft by the gate.
A server that answers but cannot say which checkpoint it serves (a router that lists models
its own way, such as vllm-router's ``--enable-igw`` ``{"models": [...]}``; an entry without
a checkpoint) while the name is of no known family *is* an error: the images would go out at
a megapixel, quietly worse, so the model is refused when it is built, with the ways to say
the frame (``resize=``, ``?max_pixels=`` in an ``openai:`` spec) or to accept the default
(``default_frame=True``, for a hosted API that resizes images itself).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speceyes_tools.geometry import Coordinates
from speceyes_tools.images import ResizeSpec

from .families import FAMILIES, box_convention, family_of, processor_resize

__all__ = [
    "ServedModelError",
    "ServedModelInfo",
    "check_top_logprobs",
    "describe_served_model",
    "served_boxes",
    "served_resize",
]

log = logging.getLogger(__name__)
_PROBE_TEXT = "Hi"


class ServedModelError(ValueError):
    """The server is reachable but cannot serve this model as the graph needs it."""


@dataclass(frozen=True)
class ServedModelInfo:
    """One entry of the server's ``/v1/models``; ``listing``: what the server listed when it
    was not OpenAI's listing (no entry, no root: the server answered but said nothing)."""

    name: str
    root: str | None  # the checkpoint the server loaded: a hub id or a folder
    max_model_len: int | None
    listing: str | None = None  # a listing that is not OpenAI's, as the server sent it


def _request(url: str, api_key: str, timeout: float, body: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    with urllib.request.urlopen(
        urllib.request.Request(url, data=data, headers=headers), timeout=timeout
    ) as response:
        return json.load(response)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read() or b"{}")
    except ValueError:
        return f"HTTP {exc.code}"
    error = payload.get("error", payload) if isinstance(payload, Mapping) else payload
    message = error.get("message") if isinstance(error, Mapping) else None
    return str(message or payload)[:300]


def describe_served_model(
    base_url: str, name: str, *, api_key: str = "EMPTY", timeout: float = 10.0
) -> ServedModelInfo | None:
    """The server's description of ``name``, or None when the server cannot say (unreachable,
    or no ``/v1/models``); a server that serves other models only raises."""
    try:
        listing = _request(f"{base_url.rstrip('/')}/models", api_key, timeout)
    except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
        log.warning("could not ask %s about %r (%s); going by the name", base_url, name, exc)
        return None
    entries = listing.get("data") if isinstance(listing, Mapping) else None
    if not isinstance(entries, list):  # a router's own listing (vllm-router --enable-igw)
        return ServedModelInfo(name, None, None, listing=json.dumps(listing)[:200])
    ids = [e.get("id") for e in entries if isinstance(e, Mapping)]
    for entry in entries:
        if isinstance(entry, Mapping) and entry.get("id") == name:
            root = entry.get("root")
            if not isinstance(root, str) or not root or root == name:
                root = _sglang_model_path(base_url, api_key, timeout)
            length = entry.get("max_model_len")
            return ServedModelInfo(
                name=name,
                root=root,
                max_model_len=length if isinstance(length, int) and length > 0 else None,
            )
    raise ServedModelError(f"{base_url} serves {ids}, not {name!r}: check the model name")


def _sglang_model_path(base_url: str, api_key: str, timeout: float) -> str | None:
    """SGLang's ``/v1/models`` reports the served name as ``root``; its ``/model_info``
    (beside the API, not under ``/v1``) has the checkpoint."""
    server = base_url.rstrip("/").removesuffix("/v1")
    try:
        info = _request(f"{server}/model_info", api_key, timeout)
    except (OSError, ValueError):
        return None
    path = info.get("model_path") if isinstance(info, Mapping) else None
    return path if isinstance(path, str) and path else None


def _checkpoint_resize(folder: Path) -> ResizeSpec | None:
    """The image frame a checkpoint folder's processor config sets, if it has one
    (``processor_config.json``, with the image processor's settings inside or beside it in
    ``preprocessor_config.json``)."""
    processor = _json_object(folder / "processor_config.json")
    image = processor.get("image_processor") or _json_object(folder / "preprocessor_config.json")
    if not isinstance(image, Mapping) or not ("image_processor_type" in image or "size" in image):
        return None
    # a Pixtral processor passes its own patch x merge to its image processor
    patch, merge = processor.get("patch_size"), processor.get("spatial_merge_size")
    pixtral = patch * merge if isinstance(patch, int) and isinstance(merge, int) else None
    return processor_resize(image, patch=pixtral)


def _json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def served_boxes(name: str, info: ServedModelInfo | None) -> Coordinates | None:
    """How the served model writes boxes: by its checkpoint's ``model_type`` where the folder
    is readable here, else by the family its names belong to; None: not documented."""
    root = info.root if info else None
    if root:
        model_type = _json_object(Path(root).expanduser() / "config.json").get("model_type")
        if isinstance(model_type, str):
            return box_convention(model_type)
    return box_convention(family_of(root or "") or family_of(name))


def served_resize(
    name: str, info: ServedModelInfo | None, *, default_frame: bool = False, url: str = ""
) -> ResizeSpec:
    """How the server's processor resizes images: from its checkpoint, else by family.

    When neither says and the server answered (``info``), the frame cannot be established:
    :class:`ServedModelError`, naming the fixes, unless ``default_frame`` accepts the 1 MP
    default. A server not reached yet gets the default with a warning (it may start later)."""
    root = info.root if info else None
    if root:
        folder = Path(root).expanduser()
        if folder.is_dir():
            resize = _checkpoint_resize(folder)
            if resize is not None:
                return resize
        family = family_of(root)
        if family:
            return FAMILIES[family]
    family = family_of(name)
    if family:
        return FAMILIES[family]
    if default_frame:
        return ResizeSpec()
    if info is not None:
        if info.listing is not None:
            said = (
                f"its /v1/models is not OpenAI's listing ({info.listing}: a router that serves "
                "several models, such as vllm-router --enable-igw?)"
            )
        elif root:
            said = f"its checkpoint {root!r} is no folder this machine reads, of no known family"
        else:
            said = "its /v1/models entry names no checkpoint"
        raise ServedModelError(
            f"cannot tell how {url or 'the server'} resizes the images of {name!r}: {said}, and "
            "the name is of no known model family. Say it: resize=ResizeSpec(factor=..., "
            "min_pixels=..., max_pixels=...) (or ?max_pixels=... in an openai: spec), serve it "
            "under its checkpoint's name, put one router in front of each model, or pass "
            f"default_frame=True to send images at most {ResizeSpec().max_pixels} pixels (for a "
            "hosted API that resizes them itself)"
        )
    log.warning(
        "could not ask the server about %r and its family is unknown: images go out at most "
        "%d pixels; pass resize= (or ?max_pixels= in an openai: spec) with what its processor "
        "uses",
        name,
        ResizeSpec().max_pixels,
    )
    return ResizeSpec()


def check_top_logprobs(
    base_url: str, name: str, k: int, *, api_key: str = "EMPTY", timeout: float = 30.0
) -> None:
    """Raise :class:`ServedModelError` when the server returns fewer than ``k`` top log-probs
    per token (refused, or silently fewer); an unreachable server is only logged."""
    body = {
        "model": name,
        "messages": [{"role": "user", "content": _PROBE_TEXT}],
        "max_tokens": 1,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": k,
    }
    fix = (
        f"start it with --max-logprobs {k} or more (vLLM; its default is 20), or lower the gate's k"
    )
    try:
        reply = _request(f"{base_url.rstrip('/')}/chat/completions", api_key, timeout, body)
    except urllib.error.HTTPError as exc:
        if exc.code in (400, 422):
            raise ServedModelError(
                f"{base_url} ({name}) refuses top_logprobs={k}: {_error_message(exc)}; {fix}"
            ) from None
        log.warning("could not check top_logprobs on %s (%s)", base_url, exc)
        return
    except (OSError, ValueError) as exc:
        log.warning("could not check top_logprobs on %s (%s)", base_url, exc)
        return
    try:
        content = reply["choices"][0]["logprobs"]["content"]
        got = min(len(entry["top_logprobs"]) for entry in content) if content else k
    except (KeyError, IndexError, TypeError):
        raise ServedModelError(
            f"{base_url} ({name}) returned no top log-probs when asked for {k}; the gate needs "
            "them (is this an OpenAI-compatible chat endpoint with logprobs?)"
        ) from None
    if got < k:
        raise ServedModelError(f"{base_url} ({name}) returned {got} top log-probs of {k}; {fix}")
