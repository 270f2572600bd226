"""The shared drafter parts (drafters/common) and the contract's helpers (specbench/drafter.py).

* RoPE: every learned family's rotary tables equal the target's own rotary embedding, on a plain
  and on a Llama-3-scaled target (the block families once ignored rope_scaling);
* the draft KV cache against a list-of-rows twin (append, crop, keep, mark / roll back);
* the checked loader's one-line refusals; checkpoint identities; DraftContext.new_rows.
"""

from __future__ import annotations

import random

import pytest
import torch

from drafters.block.model import random_block_model
from drafters.common.kv_cache import KVCache
from drafters.common.loading import load_checked
from drafters.eagle3.model import random_head
from specbench.drafter import CheckpointId, DraftContext
from specbench.errors import UserError
from specbench.targets import load_target


@pytest.fixture(scope="module")
def targets():
    return {n: load_target(n, device="cpu", dtype="float32") for n in ("tiny-llama", "tiny-qwen3", "tiny-llama3")}


def target_cos_sin(target, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(1, positions.numel(), target.hidden_size)
    cos, sin = target.model.model.rotary_emb(x, positions[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3", "tiny-llama3"])
@pytest.mark.parametrize("family", ["eagle3", "block"])
def test_drafter_rope_equals_the_targets(targets, name, family):
    target = targets[name]
    model = random_head(target) if family == "eagle3" else random_block_model(target)
    pos = torch.arange(0, 3000, 7)
    cos, sin = model.rope(pos, torch.float32)
    ref_cos, ref_sin = target_cos_sin(target, pos)
    torch.testing.assert_close(cos, ref_cos, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin, ref_sin, atol=1e-5, rtol=1e-5)


def test_scaled_target_rope_differs_from_plain(targets):
    """The negative control: the llama3 tables are not plain RoPE at the same theta, so the test
    above would catch a drafter that ignored the scaling."""
    from drafters.common.rope import Rotary

    pos = torch.arange(0, 3000, 7)
    plain = Rotary(16, 500000.0)(pos, torch.float32)[0]
    assert not torch.allclose(plain, target_cos_sin(targets["tiny-llama3"], pos)[0], atol=1e-3)


def test_kv_cache_against_rows_twin():
    rng = random.Random(0)
    cache = KVCache(2, 4, torch.float32, "cpu", capacity=3)
    rows: list[torch.Tensor] = []  # the twin: one [2, 2, 4] (k and v) per slot
    marks: list[int] = []
    for step in range(200):
        op = rng.choice(["append", "append", "crop", "keep", "mark", "roll"])
        if op == "append":
            n = rng.randint(0, 5)
            kv = torch.randn(2, 2, n, 4)
            k, v = cache.append(kv[0], kv[1])
            rows += [kv[:, :, i] for i in range(n)]
        elif op == "crop":
            n = rng.randint(0, len(rows))
            cache.crop(n)
            rows = rows[:n]
        elif op == "keep":
            start = rng.randint(0, len(rows))
            keep = sorted(rng.sample(range(start, len(rows)), rng.randint(0, len(rows) - start)))
            cache.keep(start, keep)
            rows = rows[:start] + [rows[i] for i in keep]
        elif op == "mark":
            cache.mark()
            marks.append(len(rows))
        elif op == "roll" and marks and marks[-1] <= len(rows):
            cache.roll_back()
            rows = rows[: marks.pop()]
        elif op == "roll":
            continue
        assert cache.length == len(rows), (step, op)
        if rows:
            k, v = cache.view()
            torch.testing.assert_close(torch.stack([k, v]), torch.stack(rows, dim=2))
    with pytest.raises(ValueError):
        cache.crop(cache.length + 1)


def test_load_checked_refusals():
    module = torch.nn.Linear(3, 2)
    good = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}
    load_checked(module, dict(good), "ckpt 'x'", "a test module")
    for state, words in [({"weight": torch.zeros(2, 3)}, "lacks weights: bias"),
                         ({**good, "extra": torch.zeros(1)}, "does not have: extra"),
                         ({**good, "bias": torch.zeros(3)}, r"'bias' has shape \[3\]")]:
        with pytest.raises(UserError, match=words):
            load_checked(module, state, "ckpt 'x'", "a test module")


def test_checkpoint_identity(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"one")
    b.write_bytes(b"one")
    assert CheckpointId.of_files(tmp_path, [a]).sha256 != CheckpointId.of_files(tmp_path, [b]).sha256  # names count
    b.write_bytes(b"two")
    state = {"w": torch.arange(6.0).view(2, 3)}
    same = CheckpointId.of_tensors("m", {"w": torch.arange(6.0).view(2, 3)})
    assert CheckpointId.of_tensors("m", state) == same
    assert CheckpointId.of_tensors("m", {"w": state["w"] + 1}).sha256 != same.sha256


def test_new_rows_pairing():
    first = DraftContext(tokens=torch.tensor([5, 6, 7, 8]), features=torch.arange(3.0)[:, None], pos=3, accepted_nodes=None)
    rows = first.new_rows()  # token 0 (position 0) has no row
    assert rows.tokens.tolist() == [6, 7, 8] and rows.positions.tolist() == [1, 2, 3] and rows.count == 3
    later = DraftContext(tokens=torch.tensor([9, 10]), features=torch.ones(2, 1), pos=5, accepted_nodes=torch.tensor([0, 1]))
    rows = later.new_rows()
    assert rows.tokens.tolist() == [9, 10] and rows.positions.tolist() == [4, 5] and later.first_pos == 4
