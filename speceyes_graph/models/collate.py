"""Joining processor outputs made apart into the one batch the model would have been given.

A request is prepared alone, in its caller's thread (:class:`ChatTransformersVLM` runs the
processor per request, and :mod:`.image_cache` per image), and the batch worker joins what
the requests made. Families lay pixels out differently: Qwen-VL flattens every image's
patches into one ``[patches, dim]`` tensor, Pixtral sends ``[images, 3, H, W]`` padded to the
largest image, LLaVA-NeXT and LLaVA-OneVision ``[images, tiles, 3, H, W]`` padded to the most
tiles, Idefics3 ``[prompts, tiles, 3, H, W]``. Each family's processor batches by padding at
the end of every dimension but the first, with zeros, and the model ignores the padding (by
``image_sizes``, ``pixel_attention_mask`` or all-zero tiles). :func:`pad_cat` does exactly
that, so a batch of mixed sizes stays one batch for every family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["pad_cat"]


def pad_cat(values: Sequence[Any]) -> Any:
    """Tensors joined along the first dimension, each zero-padded at the end of every other
    dimension to the largest; lists (per-image counts some processors return) concatenated."""
    import torch

    first = values[0]
    if isinstance(first, list):
        return [item for value in values for item in value]
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"cannot join processor outputs of type {type(first).__name__}")
    if len({v.ndim for v in values}) > 1:
        shapes = [tuple(v.shape) for v in values]
        raise ValueError(f"cannot join processor outputs of different ranks: {shapes}")
    if first.ndim == 0 or len(values) == 1:
        return torch.stack(list(values)) if first.ndim == 0 else first
    widest = [max(v.shape[d] for v in values) for d in range(1, first.ndim)]
    out = first.new_zeros((sum(v.shape[0] for v in values), *widest))
    row = 0
    for v in values:
        where = (slice(row, row + v.shape[0]),) + tuple(slice(0, n) for n in v.shape[1:])
        out[where] = v
        row += v.shape[0]
    return out
