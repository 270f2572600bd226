"""The target on a static KV cache, optionally compiled (torch.compile with CUDA graphs): ``--compile``.

:class:`StaticTarget` wraps a loaded :class:`~specbench.targets.Target` and keeps its three calls
(prefill, forward_tree, commit), so the decoding loop, the drafters and the AR baseline run on it
unchanged. What differs:

* the K/V live in a transformers ``StaticCache`` of ``max_len`` slots, allocated once; every
  forward sees all ``max_len`` key slots through an explicit 4-D mask (prefix columns, the tree's
  ancestor block; stale slots beyond the committed length are masked, never read);
* a tree of n nodes is padded to a bucket (the next power of two), so a compiled forward meets
  only a handful of shapes (one CUDA graph each): padding nodes see the prefix and themselves,
  no real node sees them, and their logits are dropped;
* commit copies the accepted path's slots to ``pos .. pos + k`` in place and moves the cache's
  write position back (``cumulative_length``) without touching the tensors' addresses; the
  committed length is tracked on the host (no sync).

The prefill runs eagerly (its length varies). With ``compile=True`` the tree forward goes through
``torch.compile(mode="reduce-overhead")``: CUDA graphs, CUDA only (``--compile`` is refused on a
CPU in one line). Without it (``compile=False``) the static path runs eagerly on any device; the
tests check on CPU that it gives the eager target's greedy tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import StaticCache

from specbench.errors import UserError
from specbench.targets import Target, TreeOutput
from specbench.tree import DraftTree


def bucket(n: int) -> int:
    """The padded tree size: the next power of two >= n."""
    return 1 << max(0, (n - 1).bit_length())


def check_compile(device: torch.device | str) -> None:
    """One-line refusal of --compile where it makes no sense (no CUDA: no CUDA graphs)."""
    if torch.device(device).type != "cuda":
        raise UserError("--compile captures the target forward in CUDA graphs and needs a CUDA device; drop it on the CPU")


class StaticTarget(Target):
    """``base``'s model on a static cache of ``max_len`` slots; ``compile`` = torch.compile + CUDA graphs."""

    def __init__(self, base: Target, max_len: int = 4096, compile: bool = False):
        super().__init__(base.name, base.model, base.tokenizer, base.stop_token_ids)
        self.max_len = min(int(max_len), base.max_context)
        self.compiled = bool(compile)
        self._length = 0
        self._forward = self.model
        if compile:
            check_compile(self.device)
            self._forward = torch.compile(self.model, mode="reduce-overhead", dynamic=False, fullgraph=False)
        self.cache = None

    @property
    def mode(self) -> str:
        return "static+cudagraph" if self.compiled else "static"

    @property
    def max_context(self) -> int:
        return self.max_len - 1  # the decoding loop stops one short; a bucket's padding must fit too

    @property
    def kv_length(self) -> int:
        return self._length

    def _fresh_cache(self) -> None:
        if self.cache is None:
            self.cache = StaticCache(config=self.model.config, max_cache_len=self.max_len)
        self._set_write_position(0)
        self._length = 0

    @torch.inference_mode()
    def _set_write_position(self, length: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)  # in place: the compiled graph holds its address

    def _mask(self, rows: Tensor) -> Tensor:
        """[1, 1, Q, max_len] additive mask from a [Q, max_len] bool ``rows`` (True = visible)."""
        mask = torch.zeros(1, 1, rows.shape[0], self.max_len, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~rows[None, None], torch.finfo(self.dtype).min)

    # ---------------------------------------------------------------- the three calls
    @torch.inference_mode()
    def prefill(self, ids: Tensor, feature_layers: tuple[int, ...] = ()) -> Tensor | None:
        n = ids.numel()
        if n + 1 >= self.max_len:
            raise UserError(f"the prompt ({n} tokens) does not fit the static cache of {self.max_len} slots; raise its length")
        self._fresh_cache()
        if n == 0:
            return None if not feature_layers else torch.zeros(0, self.hidden_size * len(feature_layers),
                                                                dtype=self.dtype, device=self.device)
        cols = torch.arange(self.max_len, device=self.device)
        rows = cols[None, :] <= torch.arange(n, device=self.device)[:, None]  # causal over the first n slots
        out = self.model(input_ids=ids.to(self.device)[None], position_ids=torch.arange(n, device=self.device)[None],
                         attention_mask=self._mask(rows), cache=self.cache, use_cache=True, logits_to_keep=1,
                         output_hidden_states=bool(feature_layers))
        self._length = n
        return self._features(out, feature_layers)

    @torch.inference_mode()
    def forward_tree(self, tree: DraftTree, pos: int, feature_layers: tuple[int, ...] = (), force_tree_mask: bool = False,
                     last_logits_only: bool = False) -> TreeOutput:
        if self._length != pos:
            raise RuntimeError(f"target cache holds {self._length} slots but the tree root is at position {pos}")
        return self.forward_masked(tree, pos, None, feature_layers, last_logits_only)

    @torch.inference_mode()
    def forward_masked(self, tree: DraftTree, pos: int, mask: Tensor | None, feature_layers: tuple[int, ...] = (),
                       last_logits_only: bool = False) -> TreeOutput:
        """The padded tree forward (``mask`` is ignored: a static cache needs its own, see :meth:`tree_mask`)."""
        n = tree.size
        b = bucket(n)
        if pos + b > self.max_len:
            raise UserError(f"a {n}-node tree at position {pos} does not fit the static cache of {self.max_len} slots")
        dev = self.device
        pad = b - n
        tokens = tree.tokens.to(dev)
        positions = pos + tree.depth.to(dev)
        if pad:
            tokens = torch.cat([tokens, torch.zeros(pad, dtype=tokens.dtype, device=dev)])
            positions = torch.cat([positions, torch.full((pad,), pos, dtype=positions.dtype, device=dev)])
        self._set_write_position(pos)
        out = self._forward(input_ids=tokens[None], position_ids=positions[None], attention_mask=self.tree_mask(tree, pos),
                            cache=self.cache, use_cache=True, output_hidden_states=bool(feature_layers), logits_to_keep=0)
        logits = out.logits[0, :n] if not last_logits_only else out.logits[0, n - 1 : n]
        feats = self._features(out, feature_layers)
        return TreeOutput(logits=logits.float().clone(), features=None if feats is None else feats[:n].clone())

    def tree_mask(self, tree: DraftTree, pos: int) -> Tensor:
        """[1, 1, B, max_len]: node i sees the prefix, its ancestors and itself; padding sees the prefix and itself."""
        n, b, dev = tree.size, bucket(tree.size), self.device
        visible = torch.zeros(b, self.max_len, dtype=torch.bool, device=dev)
        visible[:, :pos] = True
        visible[:n, pos : pos + n] = tree.ancestors.to(dev)
        if b > n:
            pads = torch.arange(n, b, device=dev)
            visible[pads, pos + pads] = True
        return self._mask(visible)

    def commit(self, pos: int, path: list[int]) -> None:
        """Copy the path's slots to ``pos .. pos + k`` in place; later slots become stale (masked)."""
        k = len(path)
        if path != list(range(k)):
            with torch.inference_mode():
                for layer in self.cache.layers:
                    if not layer.is_initialized:
                        continue
                    index = pos + torch.as_tensor(path, dtype=torch.long, device=layer.keys.device)
                    layer.keys[:, :, pos : pos + k] = layer.keys.index_select(2, index)
                    layer.values[:, :, pos : pos + k] = layer.values.index_select(2, index)
        self._length = pos + k
        self._set_write_position(self._length)

    def reset(self) -> None:
        self._fresh_cache()

    def truncate(self, length: int) -> None:
        if length > self._length:
            raise ValueError(f"cannot truncate a cache of {self._length} slots to {length}")
        self._length = length
        self._set_write_position(length)


def make_static(target: Target, compile: bool, max_len: int = 4096) -> StaticTarget:
    """``target`` on a static cache (compiled when asked; one-line refusal of --compile without CUDA)."""
    if compile:
        check_compile(target.device)
    return StaticTarget(target, max_len=max_len, compile=compile)


__all__ = ["StaticTarget", "bucket", "check_compile", "make_static"]
