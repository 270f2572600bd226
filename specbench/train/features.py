"""Target hidden states computed once per (target, tokenized data, layer set) and kept on disk.

Layout of one cache directory (``<cache_root>/features/<target>-<key>/``)::

    meta.json          target digest, data fingerprint, layers, hidden size, n_tokens, dtype, version
    offsets.npy        [n_seq + 1] int64: sequence s holds rows offsets[s]:offsets[s+1]
    hidden.npy         [n_tokens, n_layers, H] float16, memory-mapped (np.lib.format.open_memmap);
                       uint16 = bfloat16 bit patterns when the target's states exceed the fp16 range
    argmax.npy         [n_tokens] int32: the target's top-1 next token at each position
    done.npy           [n_seq] bool: sequences written so far (an interrupted build resumes)

``layers`` are HF ``hidden_states`` indices (0 = embeddings, i = the hidden state entering layer i,
N = the final normed output of an N-layer model). The key hashes the target's identity, the data's
fingerprint and the sorted layer set, so two drafters that tap the same layers (and the same data)
share one cache; anything else gets its own. Row t of a sequence is the target's state at position
t, the (hidden at t, token t+1) pairing of DESIGN.md is left to the drafter's loss.

fp16 range guard. States are stored in float16 (half the disk of float32, exact enough) unless a
tapped state of the target exceeds float16's range (|x| > 65504, e.g. the massive activations of
some models' residual stream), which float16 would silently turn into inf. Then the whole cache is
stored in bfloat16 (float32's range, 8 mantissa bits): numpy has no bfloat16, so ``hidden.npy``
holds the raw bfloat16 bits as uint16 (``meta.json`` says ``"dtype": "bfloat16"``), and
:meth:`FeatureCache.states` decodes either form to float32. A build that meets the first such state
part-way converts the rows written so far (float16 -> bfloat16) and goes on in bfloat16. A target
whose states are not finite at all is refused in one line, and a read that meets a non-finite
cached value (a cache written before this guard) is refused too: never a silent inf.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.errors import UserError

FEATURE_CACHE_VERSION = 1
FP16_MAX = float(np.finfo(np.float16).max)  # 65504: larger magnitudes become inf in float16


@dataclass(frozen=True)
class FeatureCache:
    """A finished cache, opened read-only and memory-mapped."""

    path: Path
    layers: tuple[int, ...]
    offsets: np.ndarray  # [n_seq + 1] int64
    hidden: np.ndarray  # [n_tokens, n_layers, H] float16, or uint16 bfloat16 bits (memmap)
    argmax: np.ndarray  # [n_tokens] int32 (memmap)
    dtype: str = "float16"  # how ``hidden`` stores the states: "float16" or "bfloat16"

    @property
    def n_sequences(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def rows(self, s: int) -> slice:
        return slice(int(self.offsets[s]), int(self.offsets[s + 1]))

    def states(self, rows: slice) -> np.ndarray:
        """The cached states of ``rows`` as float32 [n, n_layers, H], whatever the storage dtype."""
        raw = np.asarray(self.hidden[rows])
        out = bf16_bits_to_float32(raw) if self.dtype == "bfloat16" else raw.astype(np.float32)
        if not np.isfinite(out).all():
            raise UserError(f"feature cache {self.path} holds non-finite states (written before specbench guarded "
                            "the fp16 range); delete that directory and rerun to rebuild it")
        return out

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
            dtype=meta.get("dtype", "float16"),
        )


def float32_to_bf16_bits(x: torch.Tensor) -> np.ndarray:
    """bfloat16 (round to nearest even) bit patterns of ``x`` as a uint16 array."""
    return x.detach().to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bit patterns -> float32 (exact: bfloat16 is float32's top half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _convert_to_bf16(path: Path, hidden: np.ndarray) -> np.ndarray:
    """Rewrite a float16 ``hidden.npy`` (the rows written so far) as bfloat16 bits; returns the new memmap."""
    tmp = path / "hidden.bf16.tmp.npy"
    new = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint16, shape=hidden.shape)
    step = max(1, (1 << 22) // max(1, hidden.shape[1] * hidden.shape[2]))  # about 4M values at a time
    for i in range(0, hidden.shape[0], step):
        new[i : i + step] = float32_to_bf16_bits(torch.from_numpy(np.asarray(hidden[i : i + step], dtype=np.float32)))
    new.flush()
    del new, hidden
    tmp.replace(path / "hidden.npy")  # atomic: an interrupted conversion leaves the float16 file intact
    return np.load(path / "hidden.npy", mmap_mode="r+")


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
        real = [stacked[row, : lengths[s]] for row, s in enumerate(todo)]  # padding rows are never stored
        peaks = [float(x.abs().amax()) for x in real]  # nan and inf propagate into the max
        broken = [s for s, peak in zip(todo, peaks) if not math.isfinite(peak)]
        if broken:
            raise UserError(f"target '{target.name}' produced non-finite hidden states (nan or inf) on sequence "
                            f"{broken[0]} of the data, so its features cannot be cached; load it in float32 or check its weights")
        if max(peaks) > FP16_MAX and hidden.dtype == np.float16:  # float16 would overflow: bfloat16 from here on
            hidden = _convert_to_bf16(path, hidden)
        for row, s in enumerate(todo):
            rows = slice(int(offsets[s]), int(offsets[s + 1]))
            if hidden.dtype == np.uint16:
                hidden[rows] = float32_to_bf16_bits(real[row])
            else:
                hidden[rows] = real[row].to(torch.float16).cpu().numpy()
            argmax[rows] = top1[row, : lengths[s]].to(torch.int32).cpu().numpy()
            done[s] = True
        hidden.flush()
        argmax.flush()
        _save_done(path, done)
        finished += sum(lengths[s] for s in todo)
        if progress is not None:
            progress(finished, n_tokens)
    meta["dtype"] = "bfloat16" if hidden.dtype == np.uint16 else "float16"
    del hidden, argmax
    (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return FeatureCache.open(path)


def _save_done(path: Path, done: np.ndarray) -> None:
    tmp = path / "done.tmp.npy"
    np.save(tmp, done)
    tmp.replace(path / "done.npy")


__all__ = ["FeatureCache", "build_feature_cache", "cache_key", "FEATURE_CACHE_VERSION", "FP16_MAX",
           "float32_to_bf16_bits", "bf16_bits_to_float32"]
