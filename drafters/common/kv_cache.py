"""One draft KV cache: append, crop, and roll back (batch 1).

``k``/``v`` are ``[n_kv_heads, capacity, head_dim]``; slots ``[0, length)`` are valid. Growth is
amortised (the capacity doubles), so appending a few rows per decoding step copies nothing.

Roll-back. A drafter that appends speculative rows (a tree, a second block) and then learns which
of them were committed calls :meth:`crop` (drop everything after a length) or :meth:`keep` (drop
all rows after ``start`` except the listed ones, which move up in order: the accepted path of a
tree, like the target's own commit). :meth:`mark` / :meth:`roll_back` save and restore a length.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    def __init__(self, n_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 capacity: int = 256):
        self.k = torch.empty(n_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0
        self._marks: list[int] = []

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v ([n_kv_heads, n, head_dim]); return all valid keys and values (views)."""
        n = k.shape[1]
        need = self.length + n
        if need > self.k.shape[1]:
            cap = max(need, 2 * self.k.shape[1])
            grow = lambda t: torch.cat([t[:, : self.length], t.new_empty(t.shape[0], cap - self.length, t.shape[2])], dim=1)  # noqa: E731
            self.k, self.v = grow(self.k), grow(self.v)
        self.k[:, self.length : need] = k
        self.v[:, self.length : need] = v
        self.length = need
        return self.k[:, :need], self.v[:, :need]

    def view(self) -> tuple[Tensor, Tensor]:
        """All valid keys and values without appending."""
        return self.k[:, : self.length], self.v[:, : self.length]

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} slots to {length}")
        self.length = length

    def keep(self, start: int, rows: Tensor | list[int]) -> None:
        """Keep slots ``[0, start)`` followed by the slots ``rows`` (absolute, ascending, >= start)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.k.device)
        n = int(rows.numel())
        if n and (int(rows.min()) < start or int(rows.max()) >= self.length):
            raise ValueError(f"rows to keep must lie in [{start}, {self.length})")
        if n:
            self.k[:, start : start + n] = self.k[:, rows]
            self.v[:, start : start + n] = self.v[:, rows]
        self.length = start + n

    def mark(self) -> None:
        """Remember the current length (for :meth:`roll_back`)."""
        self._marks.append(self.length)

    def roll_back(self) -> None:
        """Return to the length of the last :meth:`mark`."""
        if not self._marks:
            raise ValueError("roll_back without a mark")
        self.crop(self._marks.pop())


class LayerCaches:
    """One :class:`KVCache` per drafter layer, created on first use with the shapes of the rows."""

    def __init__(self, n_layers: int, capacity: int = 256):
        self.layers: list[KVCache | None] = [None] * n_layers
        self.capacity = capacity

    def __getitem__(self, layer: int) -> KVCache | None:
        return self.layers[layer]

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.layers[layer] is None:
            self.layers[layer] = KVCache(k.shape[0], k.shape[2], k.dtype, k.device, max(self.capacity, k.shape[1]))
        return self.layers[layer].append(k, v)

    def length(self, layer: int) -> int:
        cache = self.layers[layer]
        return 0 if cache is None else cache.length

    @property
    def lengths(self) -> list[int]:
        return [self.length(i) for i in range(len(self.layers))]


__all__ = ["KVCache", "LayerCaches"]
