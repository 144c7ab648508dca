"""Joining processor outputs made apart into the one batch the model would have been given.

A request is prepared alone, in its caller's thread (:class:`ChatTransformersVLM` runs the
processor per request, and :mod:`.image_cache` per image), and the batch worker joins what
the requests made, by two rules that hold for every family:

- A tensor aligned with the token sequence -- one of its dimensions after the first is the
  request's token count, in every request: ``input_ids``, masks of any rank (Llama 3.2
  Vision's ``cross_attention_mask`` is ``[1, tokens, images, tiles]``), position and token
  type ids -- is padded in that dimension on the tokenizer's padding side
  (:func:`pad_sequences`): the pad id in ``input_ids``, -100 in ``labels``, zeros elsewhere
  (masked out; transformers fills padded positions with 0 too). Its other dimensions are
  padded at the end, as below.
- Everything else (pixels, grids, tiles, image sizes) is joined along the first dimension
  and padded at the end of every other (:func:`pad_cat`). Families lay pixels out
  differently: Qwen-VL flattens every image's patches into one ``[patches, dim]`` tensor,
  Pixtral sends ``[images, 3, H, W]`` padded to the largest image, LLaVA-NeXT and
  LLaVA-OneVision ``[images, tiles, 3, H, W]`` padded to the most tiles, Idefics3
  ``[prompts, tiles, 3, H, W]``, Llama 3.2 Vision ``[prompts, images, tiles, 3, H, W]``.
  Each family's processor batches by padding at the end of every dimension but the first,
  with zeros, and the model ignores the padding (by ``image_sizes``,
  ``pixel_attention_mask``, ``aspect_ratio_mask`` or all-zero tiles).

Both cost nothing where nothing needs padding: tensors whose shapes already agree beyond
the first dimension are joined by one ``torch.cat`` (most batches of Qwen-VL speculation
queries: every tensor but the token-aligned ones is flattened patches).

Padding is exact only where the model never reads it. Placeholder-token families scatter
image features into the prompt's placeholders, so padded pixels, tiles and images never
reach the text. A cross-attention family reads images through a sequence-aligned mask over
image slots (Llama 3.2 Vision: ``[1, tokens, images, tiles]``), and there a padded image
slot is read: a text row that sees no image (the tokens before the first ``<|image|>``)
has its mask row zeroed and attends to every slot, padded ones included -- transformers'
own batches of mixed image counts differ from each prompt alone for that reason.
:func:`exact_groups` keeps such requests apart: requests whose sequence-aligned tensors
differ in a dimension other than the sequence (or that lack one the others have) go to
``generate`` in separate calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["exact_groups", "fill_value", "pad_cat", "pad_sequences", "sequence_dim"]


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
    tail = first.shape[1:]
    if all(v.shape[1:] == tail for v in values):  # nothing to pad: no zero-fill, one copy
        return torch.cat(list(values))
    widest = [max(v.shape[d] for v in values) for d in range(1, first.ndim)]
    out = first.new_zeros((sum(v.shape[0] for v in values), *widest))
    row = 0
    for v in values:
        where = (slice(row, row + v.shape[0]),) + tuple(slice(0, n) for n in v.shape[1:])
        out[where] = v
        row += v.shape[0]
    return out


def sequence_dim(values: Sequence[Any], lengths: Sequence[int]) -> int | None:
    """The dimension of these tensors (one per request, in request order) that is aligned
    with the token sequence: the first after the batch dimension that equals each request's
    token count in every request; None where there is none (or a request lacks the tensor,
    or it is not one row per request)."""
    import torch

    first = values[0]
    if not isinstance(first, torch.Tensor) or first.ndim < 2:
        return None
    ndim = first.ndim
    if not all(isinstance(v, torch.Tensor) and v.ndim == ndim and v.shape[0] == 1 for v in values):
        return None
    for dim in range(1, ndim):
        if all(v.shape[dim] == n for v, n in zip(values, lengths, strict=True)):
            return dim
    return None


def fill_value(name: str, pad_id: int | None) -> int:
    """What padding positions hold in a sequence-aligned tensor called ``name``."""
    if name == "input_ids":
        return 0 if pad_id is None else int(pad_id)
    if name == "labels":
        return -100
    return 0  # masks (nothing attended), token types, position ids (as transformers pads)


def pad_sequences(values: Sequence[Any], dim: int, fill: int, left: bool = True) -> Any:
    """One-row tensors joined along the first dimension, padded in the sequence dimension
    ``dim`` to the longest with ``fill`` on the left (``left``) or the right, and at the end
    of every other dimension with zeros (as :func:`pad_cat`)."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    first = values[0]
    if len(values) == 1:
        return first
    tail = first.shape[1:]
    if all(v.shape[1:] == tail for v in values):  # every request as long: no padding
        return torch.cat(list(values))
    ndim = first.ndim
    if dim == 1 and all(v.shape[2:] == first.shape[2:] for v in values):  # only the sequence
        rows = [v[0] for v in values]  # differs: one call, no Python loop over rows
        side = "left" if left else "right"
        return pad_sequence(rows, batch_first=True, padding_value=fill, padding_side=side)
    widest = [max(v.shape[d] for v in values) for d in range(1, ndim)]
    longest = widest[dim - 1]
    out = first.new_zeros((len(values), *widest))
    for row, v in enumerate(values):
        n = v.shape[dim]
        pad = slice(0, longest - n) if left else slice(n, longest)
        own = slice(longest - n, longest) if left else slice(0, n)
        if fill and n < longest:
            out[(row,) + (slice(None),) * (dim - 1) + (pad,)] = fill
        where = [slice(0, k) for k in v.shape[1:]]
        where[dim - 1] = own
        out[(row,) + tuple(where)] = v[0]
    return out


def exact_groups(inputs: Sequence[Any]) -> list[list[int]]:
    """The requests (processor outputs, in batch order) as groups of indices that one padded
    batch each gives exactly what each request gives alone: requests whose sequence-aligned
    tensors of three or more dimensions (a mask over image slots) have the same other
    dimensions, and that have the same sequence-aligned tensors (a text-only prompt has no
    cross-attention mask). One group where no family needs more: every family whose
    sequence-aligned tensors are 2-D and in every request, and Llama 3.2 Vision prompts of
    as many images."""
    import torch

    lengths = [int(x["input_ids"].shape[1]) for x in inputs]
    signatures: list[list[tuple]] = [[] for _ in inputs]
    for name in dict.fromkeys(k for x in inputs for k in x):
        rows = [i for i, x in enumerate(inputs) if isinstance(x.get(name), torch.Tensor)]
        values = [inputs[i][name] for i in rows]
        if not values or (values[0].ndim < 3 and len(rows) == len(inputs)):
            continue  # 2-D in every request: padded exactly
        dim = sequence_dim(values, [lengths[i] for i in rows])
        if dim is None:
            continue
        for i, v in zip(rows, values, strict=True):
            signatures[i].append((name, tuple(v.shape[1:dim]) + tuple(v.shape[dim + 1 :])))
    keys = [tuple(signature) for signature in signatures]
    if len(set(keys)) <= 1:
        return [list(range(len(inputs)))]
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())
