"""Is a hub id loadable here? Answered in seconds, before transformers' download retries.

Offline, ``from_pretrained("owner/name")`` of a model that is not in the local cache retries
its downloads for minutes before it fails.
The cache is looked up first, then one metadata request with a short timeout says whether the
hub can be reached at all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def looks_like_hub_id(name: str) -> bool:
    """``owner/name`` that is not a folder here."""
    return bool(HUB_ID.match(name)) and not Path(name).expanduser().exists()


def hub_problem(repo_id: str, timeout_s: float = 10) -> str | None:
    """Why ``repo_id`` cannot be loaded here, or None when it can (cached, or reachable)."""
    try:
        from huggingface_hub import model_info, try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None  # cached: works offline
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return f"{repo_id} is not in the local cache and HF_HUB_OFFLINE is set"
    try:
        model_info(repo_id, timeout=timeout_s)
    except Exception as exc:
        return (
            f"{repo_id} is not in the local cache and cannot be fetched ({type(exc).__name__}); "
            "download it on a machine with access and pass the folder"
        )
    return None
