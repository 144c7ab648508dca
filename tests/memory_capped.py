"""Run a batch on a CPU whose memory is capped (``RLIMIT_AS``): run by ``test_memory.py``.

The tiny Qwen2.5-VL checkpoint with eager attention (memory grows with batch x prompt²)
answers sixteen requests with ~1,300-token images one by one, then, with the address space
capped at what it uses plus ``margin_mb``, all sixteen at once (queued together: one batch), then
one request whose image alone does not fit. Prints one JSON line: the replies alone and
batched, the failure, and the scheduler's stats. glibc's mmap threshold is fixed by the
caller (``MALLOC_MMAP_THRESHOLD_``) so large blocks are returned to the system when freed.

    python tests/memory_capped.py OUT_DIR MARGIN_MB
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np
from langchain_core.messages import HumanMessage
from PIL import Image

from speceyes_graph.demo.tiny import make_tiny_models
from speceyes_graph.models import ChatTransformersVLM


def ask(folder: Path, side: int, seed: int) -> list[HumanMessage]:
    path = folder / f"image-{side}-{seed}.png"
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(path)
    return [
        HumanMessage(
            content=[
                {"type": "image_url", "image_url": {"url": path.as_uri()}},
                {"type": "text", "text": "What colour is the umbrella?"},
            ]
        )
    ]


def address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def main() -> None:
    folder, margin_mb = Path(sys.argv[1]), int(sys.argv[2])
    paths = make_tiny_models(folder / "tiny", image_max_pixels=1600 * 1600)
    model = ChatTransformersVLM(
        model=str(paths["large"]),
        max_new_tokens=4,
        attn_implementation="eager",
        max_batch_tokens=None,  # count only: the batch of sixteen is formed, and runs out
        max_batch_size=16,
        vision_cache_bytes=0,
        image_cache_bytes=0,
    )
    requests = [ask(folder, 1000, seed) for seed in range(16)]
    huge = ask(folder, 1600, 99)
    alone = [m.content for m in (model.invoke(r) for r in requests)]
    model.scheduler.stats.__init__()  # count only the capped run
    limit = address_space() + margin_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    # prepared first and queued together, so the worker forms one batch of sixteen (as
    # sixteen concurrent callers would, given time)
    key, settings = model._settings(None, {})
    prepared = [model._prepare(r, **settings) for r in requests]
    outs = []
    for future in model.scheduler.submit_many(key, prepared):
        try:
            outs.append(future.result())
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outs.append(exc)
    try:
        model.invoke(huge)
        huge_error = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        huge_error = f"{type(exc).__name__}: {exc}"
    stats = model.scheduler.stats
    print(
        json.dumps(
            {
                "alone": alone,
                "batched": [o.content if not isinstance(o, Exception) else repr(o) for o in outs],
                "huge_error": huge_error,
                "out_of_memory": stats.out_of_memory,
                "split": stats.split,
                "sizes": dict(stats.sizes),
                "budget_cuts": stats.budget_cuts,
                "max_batch_tokens": stats.max_batch_tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
