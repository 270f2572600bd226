"""KV-cache surgery on a transformers ``DynamicCache``: keep an accepted tree path, drop the rest.

After a tree forward the cache holds ``pos`` prefix slots followed by one slot per tree node (in
node order). Committing ``path = [0, n1, ..., na]`` keeps the prefix, moves the path's slots right
after it (positions ``pos .. pos + a``) and crops everything else.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def cache_length(cache: DynamicCache | None) -> int:
    return 0 if cache is None else int(cache.get_seq_length())


def _layers(cache: DynamicCache):
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise NotImplementedError("sliding-window cache layers are not supported by tree commit yet")
        if layer.is_initialized and layer.keys is not None and layer.keys.numel() > 0:
            yield layer


def commit_path(cache: DynamicCache, pos: int, path: list[int]) -> None:
    """Keep prefix ``[0, pos)`` plus the tree slots ``pos + path[i]``, in path order; crop the rest.

    Fast path: when the path is the contiguous run ``0, 1, ..., a`` (always so for a chain) the
    slots are already in place and a crop suffices. Otherwise gather the path's slots.
    """
    keep = pos + len(path)
    total = cache_length(cache)
    if total < keep:
        raise ValueError(f"cache holds {total} slots, fewer than prefix {pos} + path {len(path)}")
    if path == list(range(len(path))):
        if total > keep:
            cache.crop(keep - total)  # a negative argument removes that many slots from the end
        return
    commit_path_gather(cache, pos, path)


def commit_path_gather(cache: DynamicCache, pos: int, path: list[int]) -> None:
    """The general commit: copy the path's slots to ``pos .. pos + len(path)`` in place (the
    prefix is not copied), then crop the rest."""
    keep = pos + len(path)
    with torch.inference_mode():
        for layer in _layers(cache):
            index = pos + torch.as_tensor(path, dtype=torch.long, device=layer.keys.device)
            layer.keys[..., pos:keep, :] = layer.keys.index_select(-2, index)
            layer.values[..., pos:keep, :] = layer.values.index_select(-2, index)
    total = cache_length(cache)
    if total > keep:
        cache.crop(keep - total)
