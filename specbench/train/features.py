"""Target hidden states computed once per (target, tokenized data, layer set) and kept on disk.

Layout of one cache directory (``<cache_root>/features/<target>-<key>/``)::

    meta.json          target digest, data fingerprint, layers, hidden size, n_tokens, version
    offsets.npy        [n_seq + 1] int64: sequence s holds rows offsets[s]:offsets[s+1]
    hidden.npy         [n_tokens, n_layers, H] float16, memory-mapped (np.lib.format.open_memmap)
    argmax.npy         [n_tokens] int32: the target's top-1 next token at each position
    done.npy           [n_seq] bool: sequences written so far (an interrupted build resumes)

``layers`` are HF ``hidden_states`` indices (0 = embeddings, i = the hidden state entering layer i,
N = the final normed output of an N-layer model). The key hashes the target's identity, the data's
fingerprint and the sorted layer set, so two drafters that tap the same layers (and the same data)
share one cache; anything else gets its own. Row t of a sequence is the target's state at position
t, the (hidden at t, token t+1) pairing of DESIGN.md is left to the drafter's loss.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

FEATURE_CACHE_VERSION = 1


@dataclass(frozen=True)
class FeatureCache:
    """A finished cache, opened read-only and memory-mapped."""

    path: Path
    layers: tuple[int, ...]
    offsets: np.ndarray  # [n_seq + 1] int64
    hidden: np.ndarray  # [n_tokens, n_layers, H] float16 (memmap)
    argmax: np.ndarray  # [n_tokens] int32 (memmap)

    @property
    def n_sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def rows(self, s: int) -> slice:
        return slice(int(self.offsets[s]), int(self.offsets[s + 1]))

    def layer_index(self, layers: Sequence[int]) -> list[int]:
        """Positions of ``layers`` in this cache's layer axis."""
        return [self.layers.index(i) for i in layers]

    @classmethod
    def open(cls, path: Path) -> "FeatureCache":
        meta = json.loads((path / "meta.json").read_text())
        return cls(
            path=path,
            layers=tuple(meta["layers"]),
            offsets=np.load(path / "offsets.npy"),
            hidden=np.load(path / "hidden.npy", mmap_mode="r"),
            argmax=np.load(path / "argmax.npy", mmap_mode="r"),
        )


def cache_key(target_digest: str, data_fingerprint: str, layers: Sequence[int]) -> str:
    recipe = json.dumps({"target": target_digest, "data": data_fingerprint, "layers": sorted(set(layers)),
                         "version": FEATURE_CACHE_VERSION}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def _batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Sequence ids grouped by length so each padded batch holds at most ``batch_tokens`` slots."""
    order = sorted(range(len(lengths)), key=lambda s: (lengths[s], s))
    out: list[list[int]] = []
    cur: list[int] = []
    for s in order:
        if cur and (len(cur) + 1) * lengths[s] > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


@torch.inference_mode()
def build_feature_cache(
    target,
    input_ids: Sequence[Sequence[int]],
    layers: Sequence[int],
    cache_dir: Path,
    *,
    target_digest: str,
    data_fingerprint: str,
    batch_tokens: int = 4096,
    progress: Callable[[int, int], Any] | None = None,
) -> FeatureCache:
    """Run ``target`` over ``input_ids`` (one list per sequence) once and store ``layers``.

    Reuses a finished cache with the same key; resumes an unfinished one. ``progress(done, total)``
    counts tokens.
    """
    layers = tuple(sorted(set(int(i) for i in layers)))
    bad = [i for i in layers if not 0 <= i <= target.num_layers]
    if bad:
        raise ValueError(f"layers {bad} are outside 0..{target.num_layers}")
    path = Path(cache_dir) / f"{target.name.replace('/', '_')}-{cache_key(target_digest, data_fingerprint, layers)}"
    lengths = [len(x) for x in input_ids]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    n_tokens, hsize = int(offsets[-1]), target.hidden_size
    meta = {"target": target.name, "target_digest": target_digest, "data": data_fingerprint, "layers": list(layers),
            "hidden_size": hsize, "n_sequences": len(lengths), "n_tokens": n_tokens, "version": FEATURE_CACHE_VERSION}

    if (path / "meta.json").exists():
        return FeatureCache.open(path)  # finished (meta.json is written last)
    path.mkdir(parents=True, exist_ok=True)
    fresh = not (path / "done.npy").exists()
    if fresh:
        np.save(path / "offsets.npy", offsets)
        hidden = np.lib.format.open_memmap(path / "hidden.npy", mode="w+", dtype=np.float16, shape=(n_tokens, len(layers), hsize))
        argmax = np.lib.format.open_memmap(path / "argmax.npy", mode="w+", dtype=np.int32, shape=(n_tokens,))
        done = np.zeros(len(lengths), dtype=bool)
        _save_done(path, done)
    else:
        if not np.array_equal(np.load(path / "offsets.npy"), offsets):
            raise RuntimeError(f"feature cache {path} was started for other data; delete it")
        hidden = np.load(path / "hidden.npy", mmap_mode="r+")
        argmax = np.load(path / "argmax.npy", mmap_mode="r+")
        done = np.load(path / "done.npy")

    device = target.device
    lm_head = target.model.get_output_embeddings()
    finished = int(sum(lengths[s] for s in range(len(lengths)) if done[s]))
    if progress is not None:
        progress(finished, n_tokens)
    for batch in _batches(lengths, batch_tokens):
        todo = [s for s in batch if not done[s]]
        if not todo:
            continue
        width = max(lengths[s] for s in todo)
        ids = torch.zeros(len(todo), width, dtype=torch.long)
        attn = torch.zeros(len(todo), width, dtype=torch.long)
        for row, s in enumerate(todo):
            ids[row, : lengths[s]] = torch.as_tensor(list(input_ids[s]))
            attn[row, : lengths[s]] = 1
        # the decoder alone, then the lm_head in slices: full [b, width, V] logits would be large
        out = target.model.base_model(input_ids=ids.to(device), attention_mask=attn.to(device),
                                      output_hidden_states=True, use_cache=False)
        stacked = torch.stack([out.hidden_states[i] for i in layers], dim=2)  # [b, width, n_layers, H]
        final = out.hidden_states[-1]  # [b, width, H], after the final norm
        top1 = torch.cat([lm_head(rows).argmax(-1) for rows in final.split(1, dim=0)])  # [b, width]
        for row, s in enumerate(todo):
            rows = slice(int(offsets[s]), int(offsets[s + 1]))
            hidden[rows] = stacked[row, : lengths[s]].to(torch.float16).cpu().numpy()
            argmax[rows] = top1[row, : lengths[s]].to(torch.int32).cpu().numpy()
            done[s] = True
        hidden.flush()
        argmax.flush()
        _save_done(path, done)
        finished += sum(lengths[s] for s in todo)
        if progress is not None:
            progress(finished, n_tokens)
    del hidden, argmax
    (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return FeatureCache.open(path)


def _save_done(path: Path, done: np.ndarray) -> None:
    tmp = path / "done.tmp.npy"
    np.save(tmp, done)
    tmp.replace(path / "done.npy")


__all__ = ["FeatureCache", "build_feature_cache", "cache_key", "FEATURE_CACHE_VERSION"]
