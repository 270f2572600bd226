"""Block training at scale (issue 10): every valid anchor in bounded chunks, a fixed held-out anchor
set, the root-sensitivity probe, and the reduced draft vocabulary variant.

* chunked backward (anchor chunks, then lm_head row chunks) gives the whole-batch gradient, loss
  and metrics, for every family and for the reduced vocabulary;
* held-out anchors are every valid anchor, whatever the weights, the family or the recipe's cap;
* the probe: a head fitted a few hundred Adam steps on a pattern only the root predicts loses its
  depth-1 accuracy when roots are shuffled; a head built never to see its root is flagged;
* the context alignment: a head fitted on a pattern only context row a-1 (the state just before
  the root) predicts learns it, one that sees a row too few does not; scripts/block-heldout-probe's
  context restriction is the model's forward with a narrower mask;
* training against decoding: on a greedy decode, every chain the drafter proposes is the training
  forward's argmax at that step's root (a position off by one fails it);
* the reduced vocabulary: the most frequent training tokens, saved and loaded with d2t/t2d,
  refused without them, drafts inside it and lossless; the full-vocabulary head stays the default.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafters.ar import ARDrafter
from drafters.block.checkpoint import load_block, save_block
from drafters.block.drafter import DFlashDrafter, JetSpecDrafter, TreeFlashDrafter
from drafters.block.model import random_block_model
from drafters.block.train import (
    BlockRecipe, DFlashTraining, JetSpecTraining, TreeFlashRecipe, TreeFlashTraining, forward_kl, hard_label_ce,
    select_anchors, valid_anchors,
)
from drafters.common.vocab import draft_vocabulary
from specbench.decode import generate
from specbench.drafter import Sampling, parse_config
from specbench.errors import UserError
from specbench.targets import load_target
from specbench.train.probe import MIN_RELATIVE_DROP, card_lines, root_probe
from specbench.train.trainer import Batch


@pytest.fixture(scope="module")
def target():
    return load_target("tiny-llama", device="cpu", dtype="float32")


def features_batch(target, tokens: torch.Tensor, loss_mask: torch.Tensor, layers, argmax: torch.Tensor | None = None) -> Batch:
    """A batch over ``tokens`` [S, T] with the target's own states at ``layers`` (argmax: the target's unless given)."""
    with torch.no_grad():
        out = target.model(input_ids=tokens, use_cache=False, output_hidden_states=True)
    hidden = torch.stack([out.hidden_states[j] for j in layers], dim=2)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    return Batch(tokens, loss_mask, valid, hidden, out.logits.argmax(-1) if argmax is None else argmax)


def random_batch(target, layers, s: int = 3, t: int = 24, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, target.vocab_size, (s, t), generator=g)
    mask = torch.rand(s, t, generator=g) < 0.8
    mask[:, :3] = False  # a prompt
    return features_batch(target, tokens, mask, layers)


def trainable(target, cls, *options: str, data: list[list[int]] | None = None):
    recipe = parse_config(cls.Recipe, ["block_size=6", *options])
    data = data or [list(range(50)) * 3]
    return cls(target, recipe, data, [[1] * len(x) for x in data])


def grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------- chunks, anchors


def treeflash_on_saved_backbone(target, tmp_path, *options):
    backbone = random_block_model(target, seed=4, block_size=6).float()
    save_block(backbone, tmp_path / "backbone", "dflash")
    return trainable(target, TreeFlashTraining, f"backbone={tmp_path / 'backbone'}", *options)


CASES = {
    "dflash": (DFlashTraining, ()),
    "jetspec": (JetSpecTraining, ()),
    "treeflash-joint": (TreeFlashTraining, ("backbone=random",)),
    "dflash-vocab": (DFlashTraining, ("draft_vocab_size=40",)),
    "jetspec-vocab": (JetSpecTraining, ("draft_vocab_size=40",)),
}


@pytest.mark.parametrize("case", [*CASES, "treeflash-frozen"])
def test_chunked_backward_is_the_whole_batch_gradient(target, tmp_path, case):
    """Anchors in chunks of 2 per sequence and lm_head rows in chunks of 7 give the loss, metrics and
    gradient of the one-piece forward (memory bounded, nothing changed)."""
    results = []
    for chunks in (("anchor_chunk=100000", "logit_chunk=100000"), ("anchor_chunk=6", "logit_chunk=7")):
        if case == "treeflash-frozen":
            tr = treeflash_on_saved_backbone(target, tmp_path, *chunks)
        else:
            cls, opts = CASES[case]
            tr = trainable(target, cls, *opts, *chunks)
        batch = random_batch(target, tr.cache_layers)
        tr.module.train()
        if chunks[0].endswith("100000"):
            loss, metrics = tr.loss(batch)
            (loss * 0.5).backward()
            value = float(loss.detach())
        else:
            value, metrics = tr.backward(batch, 0.5)
        results.append((value, metrics, grads(tr.module)))
    (v1, m1, g1), (v2, m2, g2) = results
    assert v1 == pytest.approx(v2, rel=1e-5)
    assert m1.keys() == m2.keys()
    for k in m1:
        assert m1[k] == pytest.approx(m2[k], rel=1e-5, abs=1e-6), k
    assert g1.keys() == g2.keys() and g1
    if case == "treeflash-frozen":
        assert all(k.startswith("ar_approximation.") for k in g1)
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("case", [*CASES, "treeflash-frozen"])
def test_mixed_precision_keeps_the_gradient(target, tmp_path, case):
    """precision=bf16 (autocast forward, bfloat16 lm_head) and bf16-head train the same float32
    weights on nearly the fp32 gradient; the loss stays float32. A wrong precision is refused."""
    results = {}
    for precision in ("fp32", "bf16-head", "bf16"):
        if case == "treeflash-frozen":
            tr = treeflash_on_saved_backbone(target, tmp_path, f"precision={precision}")
        else:
            cls, opts = CASES[case]
            tr = trainable(target, cls, *opts, f"precision={precision}")
        assert tr.head_weight.dtype == (torch.float32 if precision == "fp32" else torch.bfloat16)
        tr.module.train()
        value, metrics = tr.backward(random_batch(target, tr.cache_layers), 1.0)
        g = grads(tr.module)
        assert all(x.dtype == torch.float32 and torch.isfinite(x).all() for x in g.values())
        results[precision] = (value, torch.cat([x.flatten() for x in g.values()]).double())
    v32, g32 = results["fp32"]
    for precision in ("bf16-head", "bf16"):
        value, g = results[precision]
        assert value == pytest.approx(v32, rel=2e-2)
        assert torch.nn.functional.cosine_similarity(g, g32, dim=0) > 0.99, precision
        assert not torch.equal(g, g32)  # the bfloat16 path really ran
    with pytest.raises(UserError, match="precision must be one of"):
        parse_config(BlockRecipe, ["precision=fp16"])


@pytest.mark.parametrize("objective", ["hard", "soft"])
def test_fused_objectives_equal_the_autograd_chain(objective):
    """The one-buffer backward of the objectives gives the plain formula's per-row losses, log-probs
    and gradient, with a subset of rows selected and weighted as the training loop does."""
    g = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(9, 50, generator=g, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(0, 50, (9,), generator=g)
    target_logp = torch.log_softmax(torch.randn(9, 50, generator=g, dtype=torch.float64), dim=-1)
    rows, w = torch.tensor([0, 2, 3, 7]), torch.tensor([0.5, 1.0, 2.0, 0.25], dtype=torch.float64)
    fused = hard_label_ce if objective == "hard" else forward_kl
    soft = lambda: (target_logp.exp(), (target_logp.exp() * target_logp).sum(-1))  # noqa: E731
    per_row, logp = fused(logits, labels, soft)
    (w * per_row[rows]).sum().backward()
    got = logits.grad.clone()
    logits.grad = None
    ref_logp = torch.log_softmax(logits, dim=-1)
    ref = (-ref_logp.gather(1, labels[:, None])[:, 0] if objective == "hard"
           else (target_logp.exp() * (target_logp - ref_logp)).sum(-1))
    (w * ref[rows]).sum().backward()
    torch.testing.assert_close(per_row.detach(), ref.detach())
    torch.testing.assert_close(logp, ref_logp.detach())
    assert not logp.requires_grad
    torch.testing.assert_close(got, logits.grad)
    assert got[[1, 4, 5, 6, 8]].abs().max() == 0  # rows left out get no gradient
    assert torch.autograd.gradcheck(lambda x: fused(x, labels, soft)[0], (logits.detach().requires_grad_(),))


@pytest.mark.parametrize("options", [(), ("draft_vocab_size=40",), ("logit_chunk=7",)])
def test_jetspec_soft_labels_are_the_targets_distribution_at_each_row(target, options):
    """The per-batch table of JetSpec's soft labels gives, for every scored row (sequence s, block row
    k of anchor a), the target's own distribution after position a+k-1 (its lm_head on the cached
    final state, over the head's vocabulary) and sum p log p: what computing it row by row gives."""
    tr = trainable(target, JetSpecTraining, *options)
    batch = random_batch(target, tr.cache_layers)
    s, t = batch.tokens.shape
    anchors, ok = select_anchors(batch)
    pos = anchors[..., None] + torch.arange(1, 6)
    pos_c = pos.clamp(max=t - 1)
    scored = ok[..., None] & (pos < t) & batch.loss_mask.gather(1, pos_c.flatten(1)).view_as(pos)
    lookup = tr.target_rows(batch, pos_c, scored)
    si, ai, ki = scored.nonzero(as_tuple=True)
    at = pos_c[si, ai, ki] - 1
    assert bool((ki > 0).any()) and at.unique().numel() < at.numel()  # positions shared by several anchors
    p, plogp = lookup(si, at)
    final = batch.hidden[si, at, tr.cache_layers.index(tr.final_layer)]
    logp = torch.log_softmax(final @ tr.head_weight.T, dim=-1)
    assert p.shape == (si.numel(), 40 if options == ("draft_vocab_size=40",) else target.vocab_size)
    torch.testing.assert_close(p, logp.exp())
    torch.testing.assert_close(plogp, (logp.exp() * logp).sum(-1))


def test_training_takes_every_valid_anchor_up_to_the_cap(target):
    tr = trainable(target, DFlashTraining)
    batch = random_batch(target, tr.cache_layers, s=2, t=40)
    n_valid = int(valid_anchors(batch).sum())
    tr.module.train()
    _, metrics = tr.loss(batch)
    assert metrics["chain_tau"][1] == n_valid  # one block per valid anchor
    capped = trainable(target, DFlashTraining, "anchors_per_sequence=5")
    capped.module.train()
    assert capped.loss(batch)[1]["chain_tau"][1] == 10


def test_heldout_anchors_are_fixed(target):
    """Evaluation scores every valid anchor: the same rows whatever the weights, the family or the
    training cap, so checkpoints are compared on identical anchors."""
    counts = []
    for cls, opts in ((DFlashTraining, ("seed=1",)), (DFlashTraining, ("seed=2", "anchors_per_sequence=3")),
                      (JetSpecTraining, ()), (DFlashTraining, ("draft_vocab_size=40",))):
        tr = trainable(target, cls, *opts)
        batch = random_batch(target, tr.cache_layers, s=3, t=30, seed=5)
        tr.module.eval()
        with torch.no_grad():
            _, metrics = tr.loss(batch)
        counts.append({k: v[1] for k, v in metrics.items() if k.startswith("acc_") or k == "chain_tau"})
        assert metrics["chain_tau"][1] == int(valid_anchors(batch).sum())
    assert all(c == counts[0] for c in counts)
    a1, ok1 = select_anchors(batch)
    a2, ok2 = select_anchors(batch)
    assert torch.equal(a1, a2) and torch.equal(ok1, ok2)


def test_capped_draw_depends_on_the_sequence_not_its_batch(target):
    tr = trainable(target, DFlashTraining)
    big = random_batch(target, tr.cache_layers, s=3, t=40, seed=1)
    alone = Batch(*(x[1:2] for x in (big.tokens, big.loss_mask, big.valid, big.hidden, big.argmax)))
    a_big, ok_big = select_anchors(big, 4, seed=9)
    a_one, ok_one = select_anchors(alone, 4, seed=9)
    assert a_big[1][ok_big[1]].tolist() == a_one[0][ok_one[0]].tolist()
    assert select_anchors(big, 4, seed=10)[0].tolist() != a_big.tolist()


# --------------------------------------------------------------------------- the root-sensitivity probe

N_KEYS = 12


def pattern_batch(target, layers, n_seq: int, seed: int) -> Batch:
    """Triples (r, f(r), c): r random among 12 ids, f a fixed map, c a constant that is no loss
    token. The only scored rows are depth 1 at anchors r, predicting f(r): only the root tells it
    (the context rows are the target's states before r). The 'target' greedily predicts f(r)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.arange(20, 20 + N_KEYS)
    values = 100 + torch.randperm(N_KEYS, generator=torch.Generator().manual_seed(0))
    r = keys[torch.randint(0, N_KEYS, (n_seq, 10), generator=g)]
    f = values[r - 20]
    c = torch.full_like(r, 7)
    tokens = torch.stack([r, f, c], dim=-1).flatten(1)  # [S, 30]
    loss = torch.stack([torch.ones_like(r), torch.ones_like(r), torch.zeros_like(r)], dim=-1).flatten(1).bool()
    argmax = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # the "target" predicts the pattern's next token
    return features_batch(target, tokens, loss, layers, argmax)


def fit(tr, batch: Batch, steps: int) -> None:
    params = [p for p in tr.module.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=3e-3)
    tr.module.train()
    for _ in range(steps):
        opt.zero_grad()
        tr.backward(batch, 1.0)
        opt.step()
    tr.module.eval()


def probe_of(tr, batch: Batch) -> dict:
    with torch.no_grad():
        _, metrics = tr.loss(batch)
    return root_probe({k: num / den for k, (num, den) in metrics.items() if den})


class RootBlindTraining(DFlashTraining):
    """A head that never sees its root (its block starts with a fixed token instead)."""

    def block_hidden(self, kv, anchors, roots):
        return super().block_hidden(kv, anchors, torch.zeros_like(roots))


def test_root_probe_shows_the_drop_and_flags_a_root_blind_head(target):
    probes = {}
    for name, cls in (("uses root", DFlashTraining), ("root-blind", RootBlindTraining)):
        tr = trainable(target, cls, "block_size=4", "anchor_chunk=64")
        train, heldout = pattern_batch(target, tr.cache_layers, 8, seed=1), pattern_batch(target, tr.cache_layers, 8, seed=2)
        fit(tr, train, 250)
        probes[name] = probe_of(tr, heldout)
    uses, blind = probes["uses root"], probes["root-blind"]
    assert uses["acc_true_roots"] > 0.5, uses  # learned f(root) (chance: 1/12)
    assert uses["acc_shuffled_roots"] < 0.4 and uses["relative_drop"] > 0.5 and not uses["ignores_root"], uses
    assert blind["acc_true_roots"] == blind["acc_shuffled_roots"] and blind["same_argmax"] == 1.0, blind
    assert blind["ignores_root"]
    assert "Flag: head ignores its root" in "\n".join(card_lines(blind))
    assert "Flag" not in "\n".join(card_lines(uses))


def test_root_probe_rule():
    assert root_probe({"acc_0": 0.5}) is None  # no probe (e.g. EAGLE-3)
    issue = root_probe({"acc_0": 0.108, "shuffled_root_acc_0": 0.090, "shuffled_root_same_argmax_0": 0.76})
    assert issue["ignores_root"] and issue["relative_drop"] < MIN_RELATIVE_DROP  # the head issue 10 measured
    assert not root_probe({"acc_0": 0.5, "shuffled_root_acc_0": 0.1})["ignores_root"]
    assert root_probe({"acc_0": 0.0, "shuffled_root_acc_0": 0.0})["ignores_root"]


def last_row_batch(target, layers, n_seq: int, seed: int) -> Batch:
    """Triples (k, z, f(k)): k random among 12 ids, z one constant root, f a fixed map; k is no loss
    token. The only scored rows are depth 1 at anchors z, predicting f(k): only the context row just
    before the root (the target's state on k) tells it, so a head must attend to that row."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.arange(20, 20 + N_KEYS)
    values = 100 + torch.randperm(N_KEYS, generator=torch.Generator().manual_seed(0))
    k = keys[torch.randint(0, N_KEYS, (n_seq, 10), generator=g)]
    tokens = torch.stack([k, torch.full_like(k, 7), values[k - 20]], dim=-1).flatten(1)  # [S, 30]
    loss = torch.stack([torch.zeros_like(k), torch.ones_like(k), torch.ones_like(k)], dim=-1).flatten(1).bool()
    argmax = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)
    return features_batch(target, tokens, loss, layers, argmax)


class StaleContextTraining(DFlashTraining):
    """A head whose blocks see one context row too few (rows < a-1): the off-by-one the alignment
    test must catch."""

    def block_hidden(self, kv, anchors, roots):
        return super().block_hidden(kv, anchors - 1, roots)


def test_heads_read_the_context_row_just_before_the_root(target):
    """The context path and its alignment: a head fitted on fresh batches of a pattern only context
    row a-1 predicts learns it; the same head seeing rows < a-1 stays near chance (1/12). (Fitted on
    one fixed batch, both memorise the batch from its whole context instead: fresh data each step.)"""
    acc = {}
    for name, cls in (("aligned", DFlashTraining), ("stale", StaleContextTraining)):
        tr = trainable(target, cls, "block_size=4", "anchor_chunk=256")
        opt = torch.optim.Adam([p for p in tr.module.parameters() if p.requires_grad], lr=3e-3)
        tr.module.train()
        for step in range(200):
            opt.zero_grad()
            tr.backward(last_row_batch(target, tr.cache_layers, 16, seed=100 + step), 1.0)
            opt.step()
        tr.module.eval()
        with torch.no_grad():
            _, metrics = tr.loss(last_row_batch(target, tr.cache_layers, 16, seed=1))
        acc[name] = metrics["acc_0"][0] / metrics["acc_0"][1]
    assert acc["aligned"] > 0.5, acc
    assert acc["stale"] < 0.25, acc


@pytest.mark.parametrize("cls, drafter_cls, options", [
    (DFlashTraining, DFlashDrafter, ("tree=chain",)),
    (JetSpecTraining, JetSpecDrafter, ("width=1",)),  # a one-wide cumulative-log-prob tree is a chain
])
def test_decoding_drafts_what_the_training_forward_predicts(target, cls, drafter_cls, options):
    """End to end on one greedy decode: at every step, the chain the drafter proposes (from the harness's
    prefill and verify features, its positions and its context cache) is, depth by depth, the argmax of the
    training forward at that step's root over the finished sequence: what held-out accuracy scores is what
    decoding drafts (reports/block-drafters.md, "Training against decoding", checks the same on real heads)."""
    drafter = drafter_cls(target, parse_config(drafter_cls.Config, ["path=random", "seed=3", "block_size=6", "budget=6",
                                                                    *options]))
    tr = trainable(target, cls)
    tr.module.load_state_dict(drafter.model.state_dict())
    live: list[tuple[int, list[int]]] = []  # (the root's position, the drafted chain)
    propose = drafter.propose

    def recording(ctx):
        tree = propose(ctx)
        assert tree.is_chain
        live.append((ctx.pos, tree.tokens[1:].tolist()))
        return tree

    drafter.propose = recording
    prompt = torch.arange(7, 19)
    out = generate(target, drafter, prompt, 40, Sampling())
    seq = torch.cat([prompt, torch.tensor(out.output_ids)])[None]
    mask = torch.ones_like(seq, dtype=torch.bool)
    batch = features_batch(target, seq, mask, tr.cache_layers)
    anchors = torch.tensor([[pos for pos, _ in live]])
    assert len(live) >= 10 and int(anchors.max()) < seq.shape[1]
    with torch.no_grad():
        hidden = tr.block_hidden(tr.context_kv(batch), anchors, seq.gather(1, anchors))  # [1, A, B, H]
        predicted = tr.score(hidden[0, :, 1:]).argmax(-1)  # [A, B-1]
    for (pos, chain), row in zip(live, predicted.tolist()):
        assert chain == row[:len(chain)], f"root at {pos}: drafted {chain}, the training forward predicts {row}"
    assert {len(chain) for _, chain in live} == {5}


# --------------------------------------------------------------------------- the reduced draft vocabulary


def test_full_vocabulary_is_the_default(target, tmp_path):
    assert BlockRecipe().draft_vocab_size == 0 and TreeFlashRecipe().draft_vocab_size == 0
    tr = trainable(target, DFlashTraining)
    assert not tr.module.config.reduced_vocab and tr.lm_head.shape[0] == target.vocab_size
    tr.save(tmp_path / "full")
    assert "draft_vocab_size" not in json.loads((tmp_path / "full" / "config.json").read_text())
    assert not {"d2t", "t2d"} & set(load_file(str(tmp_path / "full" / "model.safetensors")))


@pytest.mark.parametrize("cls,layout", [(DFlashTraining, "dflash"), (JetSpecTraining, "jetspec")])
def test_reduced_vocabulary_round_trip_and_drafts_inside_it(target, tmp_path, cls, layout):
    data = [[(7 * i) % 300 for i in range(200)], [5, 5, 5, 9, 9, 11] * 10]
    tr = trainable(target, cls, "draft_vocab_size=40", data=data)
    ids = tr.module.draft_ids()
    assert torch.equal(ids, draft_vocabulary(data, [[1] * len(x) for x in data], 40, target.vocab_size))
    assert {5, 9, 11} <= set(ids.tolist()) and tr.lm_head.shape == (40, target.hidden_size)
    out = tr.save(tmp_path / layout, dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 40 and config["vocab_size"] == target.vocab_size
    raw = load_file(str(out / "model.safetensors"))
    assert raw["d2t"].dtype == torch.int64 and raw["t2d"].dtype == torch.bool and int(raw["t2d"].sum()) == 40
    model = load_block(out, target, layout)
    assert torch.equal(model.draft_ids(), ids)
    drafter_cls = DFlashDrafter if layout == "dflash" else JetSpecDrafter
    opts = ["budget=12"] + (["tree=marginal", "top_k=4"] if layout == "dflash" else ["width=3"])
    drafter = drafter_cls(target, parse_config(drafter_cls.Config, [f"path={out}", *opts]))
    prompt = torch.tensor([5, 5, 5, 9, 9, 11, 5, 5])
    ref = generate(target, ARDrafter(target), prompt, 12, Sampling()).output_ids
    seen = []
    inner = drafter.propose

    def propose(ctx):
        tree = inner(ctx)
        seen.extend(tree.tokens[1:].tolist())
        return tree

    drafter.propose = propose
    assert generate(target, drafter, prompt, 12, Sampling()).output_ids == ref
    assert seen and set(seen) <= set(ids.tolist())


def test_reduced_vocabulary_without_maps_is_refused(target, tmp_path):
    tr = trainable(target, DFlashTraining, "draft_vocab_size=40")
    out = tr.save(tmp_path / "v")
    raw = load_file(str(out / "model.safetensors"))
    del raw["d2t"]
    save_file(raw, str(out / "model.safetensors"))
    with pytest.raises(UserError, match="no d2t vocabulary map"):
        load_block(out, target, "dflash")
    raw = load_file(str(tr.save(tmp_path / "w") / "model.safetensors"))
    raw["d2t"] = torch.zeros_like(raw["d2t"]) + 3  # every draft id shifted: disagrees with t2d
    save_file(raw, str(tmp_path / "w" / "model.safetensors"))
    with pytest.raises(UserError, match="disagree"):
        load_block(tmp_path / "w", target, "dflash")


def test_treeflash_reduced_vocabulary_follows_its_backbone(target, tmp_path):
    base = trainable(target, DFlashTraining, "draft_vocab_size=40")
    base.save(tmp_path / "base", dtype=torch.float32)
    tf = trainable(target, TreeFlashTraining, f"backbone={tmp_path / 'base'}")
    assert torch.equal(tf.module.draft_ids(), base.module.draft_ids())
    with pytest.raises(UserError, match="set draft_vocab_size=40"):
        trainable(target, TreeFlashTraining, f"backbone={tmp_path / 'base'}", "draft_vocab_size=30")
    full = treeflash_on_saved_backbone(target, tmp_path, "draft_vocab_size=30")
    assert full.module.config.draft_vocab_size == 30
    out = full.save(tmp_path / "tf", dtype=torch.float32)
    drafter = TreeFlashDrafter(target, parse_config(TreeFlashDrafter.Config, [f"path={out}", "budget=10", "top_m=3", "top_k=3"]))
    assert torch.equal(drafter.model.draft_ids(), full.module.draft_ids())


# --------------------------------------------------------------------------- scripts/block-heldout-probe --context


def probe_script():
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "block-heldout-probe"
    loader = importlib.machinery.SourceFileLoader("block_heldout_probe", str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_context_probe_wrapper_is_the_model_forward_with_a_narrower_mask(target):
    script = probe_script()
    model = random_block_model(target, seed=3, block_size=4).float()
    batch = random_batch(target, [1, 2], s=2, t=20)
    kv = model.context_kv(model.context(batch.hidden.flatten(2)))  # [S, T, taps * H]
    anchors = torch.tensor([[3, 9, 15], [5, 6, 12]])
    block = torch.randn(2, 3, 4, model.config.hidden_size)
    with torch.no_grad():
        own = model.forward_anchors_kv(block, anchors, kv)
        with script.restricted_context(model, lambda rel: rel >= 1):  # every row before the root
            same = model.forward_anchors_kv(block, anchors, kv)
        with script.restricted_context(model, script.CONTEXT_PROBES["drop-last"]):
            stale = model.forward_anchors_kv(block, anchors, kv)
        assert "context_visible" not in vars(model)  # the wrapper is gone after the block
        after = model.forward_anchors_kv(block, anchors, kv)
    torch.testing.assert_close(same, own, atol=1e-4, rtol=1e-4)  # (the model's own keeps fewer context columns)
    torch.testing.assert_close(after, own)
    assert (stale - own).abs().max() > 1e-2


def test_attention_probe_reads_the_depth1_querys_weights(target):
    """scripts/block-heldout-probe --attention: the recorder leaves the forward as it was; with every
    score equal the shares are the closed-form uniform ones; with all of a query's weight on its
    root (or on context row a-1) the tally puts it there."""
    script = probe_script()
    tr = trainable(target, DFlashTraining, data=[list(range(30))])
    model = tr.module.float()
    b = model.config.block_size
    batch = random_batch(target, tr.cache_layers, s=2, t=20)
    anchors, ok = select_anchors(batch)
    roots = batch.tokens.gather(1, anchors)
    with torch.no_grad():
        kv = tr.context_kv(batch)
        own = tr.block_hidden(kv, anchors, roots)
        with script.recorded_attention(model) as seen:
            same = tr.block_hidden(kv, anchors, roots)
    assert all(len(calls) == 1 for calls in seen)
    assert "attention" not in vars(model.layers[0].self_attn)
    torch.testing.assert_close(same, own)
    row, finite = seen[0][0]
    torch.testing.assert_close(row.sum(-1), torch.ones(row.shape[:-1]))
    a = anchors[ok].float()
    assert torch.equal(finite[ok][:, 0].sum(-1).float(), a + b)  # rows 0..a-1 and the block's b keys

    def shares(weights):  # every layer's attention replaced by ``weights(scores)``
        for layer in model.layers:
            layer.self_attn.attention = weights
        try:
            return script.depth1_attention(tr, [batch])
        finally:
            for layer in model.layers:
                del layer.self_attn.attention

    uniform = (1 / (a + b)).mean().item()
    flat = shares(lambda s: torch.softmax(torch.where(torch.isfinite(s), 0.0, s), dim=-1))
    for layer in flat:
        for k in ("root", "prev_row", "uniform", "root_best_head"):
            assert layer[k] == pytest.approx(uniform, rel=1e-5)
        assert layer["context"] == pytest.approx((a / (a + b)).mean().item(), rel=1e-5)

    def one_hot(s, at):
        w = torch.zeros_like(s, dtype=torch.float32)
        return w.scatter(-1, at(s), 1.0)

    on_root = shares(lambda s: one_hot(s, lambda s: torch.full_like(s[..., :1], s.shape[-1] - b, dtype=torch.long)))
    on_prev = shares(lambda s: one_hot(s, lambda s: (torch.isfinite(s[..., : s.shape[-1] - b]).sum(-1, keepdim=True) - 1)))
    for layer in on_root:
        assert (layer["root"], layer["root_best_head"], layer["prev_row"], layer["context"]) == pytest.approx((1, 1, 0, 0))
    for layer in on_prev:
        assert (layer["root"], layer["prev_row"], layer["context"]) == pytest.approx((0, 1, 1))
