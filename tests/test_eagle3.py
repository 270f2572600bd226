"""EAGLE-3: the head, its dynamic tree, its checkpoints, and losslessness through the one loop.

* greedy losslessness against ``ar`` on both tiny targets (random-init heads: little is accepted),
  and with a head fitted in a few seconds on the target's own greedy text (much is accepted, so
  multi-token commits and the head cache roll-back run);
* the slow twin: every tree equals one rebuilt from scratch (no KV cache, no tree mask: each
  frontier node's path is re-run causally after all committed rows), and the committed head cache
  equals a one-shot teacher-forced pass over the final sequence (the training-time pairing);
* the dynamic tree builder against a brute-force reference; tree shape and budget;
* checkpoints: exact upstream key set, save/load round trip (identical drafts and outputs), d2t/t2d
  preserved, a hand-written upstream-layout checkpoint loads, mismatches and missing maps refused.
"""

from __future__ import annotations

import dataclasses

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from drafters.ar import ARDrafter
from drafters.eagle3 import (
    DynamicTreeBuilder, Eagle3Config, Eagle3Drafter, Eagle3Head, default_feature_layers, load_eagle3, new_cache,
    save_eagle3,
)
from specbench.decode import generate
from specbench.drafter import DraftContext, Sampling, available_drafters, parse_config
from specbench.errors import UserError
from specbench.targets import load_target
from specbench.tasks import load_task, render_chat
from specbench.tree import depths

TARGETS = ["tiny-llama", "tiny-qwen3"]
MAX_NEW = 32
N_PROMPTS = 10
SMALL = dict(depth=4, top_k=4, total_tokens=16)  # a cheaper tree for the slow-twin checks
MEDIUM = dict(depth=3, top_k=4, total_tokens=12)  # random heads accept ~nothing: keep them cheap

UPSTREAM_KEYS = {
    "fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


class Setup:
    def __init__(self, name: str):
        self.target = load_target(name, device="cpu", dtype="float32")
        tok = self.target.tokenizer
        texts = [p.turns[0][:32] for p in load_task("humaneval")[:4]] + [p.turns[0][:32] for p in load_task("mt-bench")[:4]]
        self.prompts = [torch.tensor(render_chat(tok, [{"role": "user", "content": t}])) for t in texts]
        self.prompts += [torch.tensor(tok.encode("abc abc abc abc abc abc")), torch.tensor(tok.encode("the cat sat on the mat. the cat"))]
        assert len(self.prompts) == N_PROMPTS
        self.reference = [run(self.target, ARDrafter(self.target), p).output_ids for p in self.prompts]


def run(target, drafter, prompt, max_new: int = MAX_NEW, sampling: Sampling | None = None):
    return generate(target, drafter, prompt, max_new, sampling or Sampling())


@pytest.fixture(scope="module")
def setups():
    return {name: Setup(name) for name in TARGETS}


# --------------------------------------------------------------------------- a fitted head


def fit_head(target, sequences: list[torch.Tensor], draft_vocab_size: int, steps: int = 70) -> Eagle3Head:
    """An oracle-ish head: a random head fitted (teacher-forced, depth 1 only) until it memorises
    the target's choices along ``sequences`` (prompt + the target's greedy continuation).

    Row p = (token p, target features of position p-1) -> the target's argmax at p: the pairing of
    a one-shot training pass. The drafter then sees these rows built incrementally from
    DraftContexts, so drafts are right (and accepted) only if both pairings agree. The draft vocab
    is the most frequent target choices, so d2t / t2d matter.
    """
    drafter = Eagle3Drafter(target, Eagle3Config(path="random", draft_vocab_size=draft_vocab_size, seed=3))
    head = drafter.head
    embed = target.model.get_input_embeddings()
    rows_emb, rows_feat, rows_label, rows_pos, rows_seq = [], [], [], [], []
    with torch.no_grad():
        for i, seq in enumerate(sequences):
            out = target.model(input_ids=seq[None], use_cache=False, output_hidden_states=True)
            feats = torch.cat([out.hidden_states[j][0] for j in drafter.feature_layers], dim=-1)  # [T, 3H]
            rows_emb.append(embed(seq[1:]))
            rows_feat.append(feats[:-1])
            rows_label.append(out.logits[0, 1:].argmax(-1))
            rows_pos.append(torch.arange(seq.numel() - 1))
            rows_seq.append(torch.full((seq.numel() - 1,), i))
    emb, fused_in, labels = torch.cat(rows_emb), torch.cat(rows_feat), torch.cat(rows_label)
    positions, seq_id = torch.cat(rows_pos), torch.cat(rows_seq)
    counts = torch.bincount(labels, minlength=target.vocab_size)
    head.set_vocab_mapping(torch.sort(counts, descending=True, stable=True).indices[:draft_vocab_size].sort().values)
    draft_id = torch.cumsum(head.t2d.long(), 0) - 1  # target id -> draft id (where t2d)
    keep = head.t2d[labels]
    draft_labels = draft_id[labels][keep]
    mask = (seq_id[:, None] == seq_id[None, :]) & (positions[:, None] >= positions[None, :])  # block-causal
    head.train()
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = head.draft_logits(head(emb, head.fuse(fused_in), positions, None, mask))[keep]
        loss = torch.nn.functional.cross_entropy(logits, draft_labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.eval()
    accuracy = float((logits.argmax(-1) == draft_labels).float().mean())
    assert accuracy > 0.95, f"the oracle-ish head did not fit ({accuracy:.2f})"
    return head


@pytest.fixture(scope="module")
def fitted_dir(setups, tmp_path_factory):
    setup = setups["tiny-llama"]
    sequences = [torch.cat([p, torch.tensor(r)]) for p, r in zip(setup.prompts, setup.reference)]
    out = tmp_path_factory.mktemp("eagle3-fitted")
    save_eagle3(fit_head(setup.target, sequences, draft_vocab_size=128), out)
    return out


# --------------------------------------------------------------------------- the slow twin


class Recording:
    """Wraps an Eagle3Drafter: keeps the committed sequence and its features, and checks every
    proposed tree against a from-scratch rebuild."""

    def __init__(self, drafter: Eagle3Drafter):
        self.inner = drafter
        self.feature_layers = drafter.feature_layers
        self.checked = 0

    def reset(self, sampling):
        self.inner.reset(sampling)
        self.tokens: list[torch.Tensor] = []
        self.features: list[torch.Tensor] = []

    def propose(self, ctx: DraftContext):
        self.tokens.append(ctx.tokens)
        self.features.append(ctx.features)
        tree = self.inner.propose(ctx)
        ref = reference_tree(self.inner, torch.cat(self.tokens), torch.cat(self.features), ctx.pos)
        assert torch.equal(tree.tokens, ref.tokens) and torch.equal(tree.parents, ref.parents)
        self.checked += 1
        return tree


@torch.no_grad()
def reference_tree(drafter: Eagle3Drafter, seq: torch.Tensor, feats: torch.Tensor, pos: int):
    """The tree built with no cache reuse and no tree mask: for every frontier node, a fresh cache,
    all committed rows causally, then the node's path one row at a time."""
    head, embed, cfg = drafter.head, drafter.embed, drafter.config
    rows_tok, rows_feat = seq[1:], feats  # token 0 has no predecessor: no row (features start at token 1)

    def node_hidden(path: list[int]) -> torch.Tensor:
        cache = new_cache(head)
        hidden = head(embed(rows_tok), head.fuse(rows_feat), torch.arange(rows_tok.numel()), cache)[-1:]
        for d, tok in enumerate(path):  # the node at depth d + 1 sits at RoPE position pos + d
            hidden = head(embed(torch.tensor([tok])), hidden, torch.tensor([pos + d]), cache)
        return hidden[0]

    def path_of(cand: int) -> list[int]:
        parents, tokens = builder.parents.tolist(), head.to_target_ids(builder.tokens).tolist()
        out = []
        while cand != -1:
            out.append(tokens[cand])
            cand = parents[cand]
        return out[::-1]

    logprobs = lambda h: torch.log_softmax(head.draft_logits(h).float(), dim=-1)  # noqa: E731
    builder = DynamicTreeBuilder(cfg.top_k)
    builder.start(logprobs(node_hidden([])))
    for _ in range(1, cfg.depth):
        builder.step(torch.stack([logprobs(node_hidden(path_of(c))) for c in builder.frontier.tolist()]))
    return builder.to_tree(int(seq[-1]), cfg.total_tokens - 1, token_map=head.to_target_ids)


@torch.no_grad()
def check_committed_rows(drafter: Eagle3Drafter, target, output_ids: list[int], prompt: torch.Tensor) -> None:
    """The head cache's committed rows equal one teacher-forced pass over the sequence (features of
    position p-1 with token p, as in training)."""
    seq = torch.cat([prompt, torch.tensor(output_ids)])
    n = drafter.n_committed
    out = target.model(input_ids=seq[None], use_cache=False, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i][0] for i in drafter.feature_layers], dim=-1)
    cache = new_cache(drafter.head)
    drafter.head(drafter.embed(seq[1 : n + 1]), drafter.head.fuse(feats[:n]), torch.arange(n), cache)
    torch.testing.assert_close(drafter.cache.k[:, :n], cache.k[:, :n], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(drafter.cache.v[:, :n], cache.v[:, :n], atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- losslessness


def test_fitted_head_lossless_and_accepts(setups, fitted_dir):
    setup = setups["tiny-llama"]
    drafter = Eagle3Drafter(setup.target, Eagle3Config(path=str(fitted_dir)))
    accepted = []
    for i, (prompt, ref) in enumerate(zip(setup.prompts, setup.reference)):
        gen = run(setup.target, drafter, prompt)
        assert gen.output_ids == ref, f"prompt {i}"
        accepted += [s.accepted for s in gen.steps]
    # the head was fitted at depth 1 only (its self-fed depths are untrained): the first draft is
    # accepted almost every step, which only happens if the drafter pairs features as training did
    assert sum(a >= 1 for a in accepted) > 0.8 * len(accepted), accepted


@pytest.mark.parametrize("fitted", [False, True])
def test_trees_equal_slow_twin(setups, fitted_dir, fitted):
    setup = setups["tiny-llama"]
    config = Eagle3Config(path=str(fitted_dir) if fitted else "random", draft_vocab_size=0 if fitted else 100, **SMALL)
    drafter = Eagle3Drafter(setup.target, config)
    recording = Recording(drafter)
    accepted = 0
    for prompt, ref in list(zip(setup.prompts, setup.reference))[-2:]:
        gen = run(setup.target, recording, prompt, max_new=16)
        assert gen.output_ids == ref[:16]
        accepted += sum(s.accepted for s in gen.steps)
        check_committed_rows(drafter, setup.target, gen.output_ids, prompt)
    assert recording.checked > 0
    if fitted:
        assert accepted > 0


def test_sampled_generation_runs(setups):
    for name, setup in setups.items():
        drafter = Eagle3Drafter(setup.target, Eagle3Config(path="random", draft_vocab_size=64, **SMALL))
        for seed, prompt in enumerate(setup.prompts[:2]):
            sampling = Sampling(temperature=1.0, top_p=0.95, generator=torch.Generator().manual_seed(seed))
            gen = run(setup.target, drafter, prompt, max_new=16, sampling=sampling)
            assert 0 < len(gen.output_ids) <= 16
            assert all(0 <= t < setup.target.vocab_size for t in gen.output_ids)


# --------------------------------------------------------------------------- tree shape and builder


def first_context(target, prompt: torch.Tensor, layers) -> DraftContext:
    feats = target.prefill(prompt[:-1], layers)  # rows of tokens 1.. (token 0 has no predecessor)
    return DraftContext(tokens=prompt, features=feats, pos=prompt.numel() - 1, accepted_nodes=None)


@pytest.mark.parametrize("depth,top_k,total", [(7, 10, 60), (3, 3, 10), (2, 2, 100), (1, 5, 60), (5, 1, 60)])
def test_tree_shape(setups, depth, top_k, total):
    setup = setups["tiny-qwen3"]
    drafter = Eagle3Drafter(setup.target, Eagle3Config(path="random", depth=depth, top_k=top_k, total_tokens=total, draft_vocab_size=50))
    drafter.reset(Sampling())
    tree = drafter.propose(first_context(setup.target, setup.prompts[0], drafter.feature_layers))
    candidates = top_k + (depth - 1) * top_k * top_k
    assert tree.size == min(total, 1 + candidates)  # the budget counts the root
    assert bool((tree.parents[1:] < torch.arange(1, tree.size)).all())
    assert int(depths(tree.parents).max()) <= depth
    assert tree.n_forwards == depth and tree.draft_probs is None
    assert int(tree.tokens[0]) == int(setup.prompts[0][-1])
    assert bool(drafter.head.t2d[tree.tokens[1:]].all())  # every draft lies in the draft vocabulary
    # siblings are distinct tokens
    pairs = list(zip(tree.parents.tolist(), tree.tokens.tolist()))
    assert len(set(pairs)) == len(pairs)


def brute_force_nodes(logprobs_of, top_k: int, depth: int, budget: int) -> set[tuple[int, ...]]:
    """The spec, literally, on python lists: expand top_k children of every frontier path, keep the
    top_k new paths by cumulative log-prob as the frontier, finally keep the best `budget` paths."""
    frontier = [((), 0.0)]
    candidates = []
    for _ in range(depth):
        new = []
        for path, score in frontier:
            lp = logprobs_of(path).tolist()
            for tok in sorted(range(len(lp)), key=lambda t: -lp[t])[:top_k]:
                new.append((path + (tok,), score + lp[tok]))
        candidates += new
        frontier = sorted(new, key=lambda c: -c[1])[:top_k]
    return {path for path, _ in sorted(candidates, key=lambda c: -c[1])[:budget]}


@pytest.mark.parametrize("trial", range(12))
def test_builder_matches_brute_force(trial):
    rng = random.Random(trial)
    vocab, top_k, depth = rng.randint(3, 9), rng.randint(1, 4), rng.randint(1, 4)
    budget = rng.randint(1, 40)
    table: dict[tuple[int, ...], torch.Tensor] = {}

    def logprobs_of(path: tuple[int, ...]) -> torch.Tensor:
        if path not in table:
            g = torch.Generator().manual_seed(hash((trial, path)) % (1 << 31))
            table[path] = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2, -1).float()
        return table[path]

    builder = DynamicTreeBuilder(top_k)
    builder.start(logprobs_of(()))

    def path_of(c: int) -> tuple[int, ...]:
        parents, tokens = builder.parents.tolist(), builder.tokens.tolist()
        out = []
        while c != -1:
            out.append(tokens[c])
            c = parents[c]
        return tuple(out[::-1])

    for _ in range(1, depth):
        builder.step(torch.stack([logprobs_of(path_of(c)) for c in builder.frontier.tolist()]))
    tree = builder.to_tree(root_token=999, budget=budget)
    got = set()
    toks, pars = tree.tokens.tolist(), tree.parents.tolist()
    for i in range(1, tree.size):
        path, j = [], i
        while j != 0:
            path.append(toks[j])
            j = pars[j]
        got.add(tuple(path[::-1]))
    assert len(got) == tree.size - 1
    assert got == brute_force_nodes(logprobs_of, top_k, depth, budget)


def test_builder_ties_stay_ancestor_closed():
    """All-equal log-probs (a flat head): ties must never keep a child without its parent."""
    builder = DynamicTreeBuilder(3)
    flat = torch.log_softmax(torch.zeros(5), -1)
    builder.start(flat)
    for _ in range(3):
        builder.step(flat.expand(builder.frontier.numel(), -1))
    for budget in range(1, 40):
        builder.to_tree(0, budget)  # raises if not ancestor-closed (DraftTree checks the order)
    builder = DynamicTreeBuilder(2)
    builder.start(torch.tensor([0.0, -50.0, -60.0]))  # probability one: child scores equal the parent's
    builder.step(torch.tensor([[0.0, -40.0, -70.0], [0.0, -1.0, -2.0]]))
    assert builder.to_tree(0, 2).parents.tolist() == [-1, 0, 1]


# --------------------------------------------------------------------------- checkpoints


def test_registered_and_configurable():
    assert "eagle3" in available_drafters()
    cfg = parse_config(Eagle3Config, ["depth=3", "top_k=4", "total_tokens=20", "path="])
    assert (cfg.depth, cfg.top_k, cfg.total_tokens, cfg.path) == (3, 4, 20, "")
    with pytest.raises(UserError):
        parse_config(Eagle3Config, ["depth=0"])


def test_state_dict_keys_are_upstream(setups):
    head = Eagle3Drafter(setups["tiny-llama"].target, Eagle3Config(path="random")).head
    assert set(head.state_dict()) == UPSTREAM_KEYS
    assert head.fc.weight.shape == (64, 3 * 64) and head.midlayer.self_attn.q_proj.weight.shape[1] == 128


def test_default_feature_layers():
    assert default_feature_layers(32) == (2, 16, 29)
    assert default_feature_layers(36) == (2, 18, 33)


def test_save_load_round_trip(setups, tmp_path):
    setup = setups["tiny-qwen3"]
    target = setup.target
    first = Eagle3Drafter(target, Eagle3Config(path="random", draft_vocab_size=120, seed=7, **SMALL))
    save_eagle3(first.head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 120 and config["vocab_size"] == target.vocab_size
    # SGLang's eagle_config names layer outputs: HF hidden_states index - 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in first.feature_layers]
    raw = load_file(str(tmp_path / "model.safetensors"))
    assert set(raw) == UPSTREAM_KEYS and raw["d2t"].dtype == torch.int64 and raw["t2d"].dtype == torch.bool

    second = Eagle3Drafter(target, Eagle3Config(path=str(tmp_path), **SMALL))
    assert second.feature_layers == first.feature_layers
    for key, value in first.head.state_dict().items():
        assert torch.equal(value, second.head.state_dict()[key]), key
    # d2t / t2d preserved exactly: the same 120 target ids, in the same draft order
    ids = torch.arange(120)
    assert torch.equal(first.head.to_target_ids(ids), second.head.to_target_ids(ids))
    assert int(second.head.t2d.sum()) == 120 and bool(second.head.t2d[second.head.to_target_ids(ids)].all())
    # identical drafts, identical outputs
    for prompt in setup.prompts[:2]:
        for d in (first, second):
            d.reset(Sampling())
        ctx = first_context(target, prompt, first.feature_layers)
        a, b = first.propose(ctx), second.propose(ctx)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
        ga, gb = run(target, first, prompt, max_new=16), run(target, second, prompt, max_new=16)
        assert ga.output_ids == gb.output_ids
        assert [s.accepted for s in ga.steps] == [s.accepted for s in gb.steps]


def upstream_checkpoint(path, draft_vocab: int = 96, hidden: int = 64, vocab: int = 384, drop=(), bin_format=False):
    """A checkpoint written by hand in the released layout (SpecForge-style config, bf16 weights,
    an embed_tokens.weight the loader must ignore)."""
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "bos_token_id": None, "eos_token_id": 258,
        "head_dim": 16, "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 1,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "vocab_size": vocab, "draft_vocab_size": draft_vocab,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(5)
    w = lambda *shape: (torch.randn(*shape, generator=g) * 0.1).to(torch.bfloat16)  # noqa: E731
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors = {
        "fc.weight": w(hidden, 3 * hidden),
        "midlayer.hidden_norm.weight": 1 + w(hidden), "midlayer.input_layernorm.weight": 1 + w(hidden),
        "midlayer.post_attention_layernorm.weight": 1 + w(hidden),
        "midlayer.self_attn.q_proj.weight": w(64, 2 * hidden), "midlayer.self_attn.k_proj.weight": w(32, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": w(32, 2 * hidden), "midlayer.self_attn.o_proj.weight": w(hidden, 64),
        "midlayer.mlp.gate_proj.weight": w(128, hidden), "midlayer.mlp.up_proj.weight": w(128, hidden),
        "midlayer.mlp.down_proj.weight": w(hidden, 128), "norm.weight": 1 + w(hidden), "lm_head.weight": w(draft_vocab, hidden),
        "d2t": ids - torch.arange(draft_vocab), "t2d": t2d, "embed_tokens.weight": w(vocab, hidden),
    }
    for key in drop:
        tensors.pop(key)
    if bin_format:
        torch.save(tensors, path / "pytorch_model.bin")
    else:
        save_file(tensors, str(path / "model.safetensors"))
    return tensors


@pytest.mark.parametrize("bin_format", [False, True])
def test_loads_upstream_layout(setups, tmp_path, bin_format):
    setup = setups["tiny-llama"]
    written = upstream_checkpoint(tmp_path, bin_format=bin_format)
    head = load_eagle3(tmp_path, setup.target)
    state = head.state_dict()
    for key, value in written.items():
        if key == "embed_tokens.weight":
            assert key not in state
        else:
            assert torch.equal(state[key], value.to(state[key].dtype)), key
    assert head.fc.weight.dtype == torch.float32  # the target's dtype
    if bin_format:
        return  # the same head; generating once is enough
    drafter = Eagle3Drafter(setup.target, Eagle3Config(path=str(tmp_path), **SMALL))
    assert drafter.feature_layers == default_feature_layers(setup.target.num_layers)
    for prompt, ref in list(zip(setup.prompts, setup.reference))[:2]:
        assert run(setup.target, drafter, prompt, max_new=16).output_ids == ref[:16]


def assert_refused(path, target, *words):
    with pytest.raises(UserError) as info:
        load_eagle3(path, target)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for word in words:
        assert word in msg, msg


def test_mismatches_refused(setups, tmp_path):
    target = setups["tiny-llama"].target
    upstream_checkpoint(tmp_path / "vocab", vocab=500)
    assert_refused(tmp_path / "vocab", target, "vocab_size 500", "384")
    upstream_checkpoint(tmp_path / "hidden", hidden=32)
    assert_refused(tmp_path / "hidden", target, "hidden size 32", "64")
    upstream_checkpoint(tmp_path / "no-d2t", drop=("d2t",))
    assert_refused(tmp_path / "no-d2t", target, "d2t", "never regenerates")
    upstream_checkpoint(tmp_path / "no-maps", drop=("d2t", "t2d"))
    assert_refused(tmp_path / "no-maps", target, "d2t / t2d")
    upstream_checkpoint(tmp_path / "no-fc", drop=("fc.weight",))
    assert_refused(tmp_path / "no-fc", target, "fc.weight")
    # a recorded layer count and taps beyond the target's depth
    save_eagle3(Eagle3Drafter(target, Eagle3Config(path="random")).head, tmp_path / "layers")
    cfg_path = tmp_path / "layers" / "config.json"
    config = json.loads(cfg_path.read_text())
    config["specbench"]["target_num_hidden_layers"] = 8
    cfg_path.write_text(json.dumps(config))
    assert_refused(tmp_path / "layers", target, "8 layers", "has 4")
    del config["specbench"]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3, 6]
    cfg_path.write_text(json.dumps(config))
    assert_refused(tmp_path / "layers", target, "taps")
    # inconsistent maps, and no checkpoint at all
    tensors = upstream_checkpoint(tmp_path / "bad-map")
    tensors["t2d"][0] = ~tensors["t2d"][0]
    save_file(tensors, str(tmp_path / "bad-map" / "model.safetensors"))
    assert_refused(tmp_path / "bad-map", target, "t2d")
    assert_refused(tmp_path / "missing", target, "not a directory")
    with pytest.raises(UserError):
        Eagle3Drafter(target, Eagle3Config(path=str(tmp_path / "missing")))


def test_full_vocab_upstream_checkpoint_uses_identity_map(setups, tmp_path):
    """Upstream leaves t2d all False when the draft vocab is the whole vocab (it never reads it)."""
    setup = setups["tiny-llama"]
    tensors = upstream_checkpoint(tmp_path, draft_vocab=384)
    tensors["d2t"] = torch.zeros(384, dtype=torch.long)
    tensors["t2d"] = torch.zeros(384, dtype=torch.bool)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    head = load_eagle3(tmp_path, setup.target)
    assert torch.equal(head.to_target_ids(torch.arange(384)), torch.arange(384)) and bool(head.t2d.all())


def test_full_vocab_upstream_checkpoint_without_maps_loads(setups, tmp_path):
    """Upstream EAGLE deletes d2t / t2d exactly when the draft vocab is the whole vocabulary
    (``ea_model.py``), so such a release carries neither: it loads with the identity map and stays
    lossless. Broken full-vocabulary checkpoints and reduced ones without maps are still refused."""
    setup = setups["tiny-llama"]
    target = setup.target
    written = upstream_checkpoint(tmp_path / "full", draft_vocab=384, drop=("d2t", "t2d"))
    head = load_eagle3(tmp_path / "full", target)
    assert torch.equal(head.to_target_ids(torch.arange(384)), torch.arange(384)) and bool(head.t2d.all())
    state = head.state_dict()
    for key, value in written.items():
        if key != "embed_tokens.weight":
            assert torch.equal(state[key], value.to(state[key].dtype)), key
    drafter = Eagle3Drafter(target, Eagle3Config(path=str(tmp_path / "full"), **SMALL))
    for prompt, ref in list(zip(setup.prompts, setup.reference))[:2]:
        assert run(target, drafter, prompt, max_new=16).output_ids == ref[:16]

    upstream_checkpoint(tmp_path / "no-head", draft_vocab=384, drop=("d2t", "t2d", "lm_head.weight"))
    assert_refused(tmp_path / "no-head", target, "lacks weights", "lm_head.weight")
    short = upstream_checkpoint(tmp_path / "short-head", draft_vocab=384, drop=("d2t", "t2d"))
    short["lm_head.weight"] = short["lm_head.weight"][:96].contiguous()
    save_file(short, str(tmp_path / "short-head" / "model.safetensors"))
    assert_refused(tmp_path / "short-head", target, "lm_head.weight", "[96, 64]", "[384, 64]")
    upstream_checkpoint(tmp_path / "reduced", draft_vocab=96, drop=("d2t", "t2d"))
    assert_refused(tmp_path / "reduced", target, "d2t / t2d", "never regenerates")


def test_one_token_prompt(setups):
    """The first token has no predecessor and no head row: the first round drafts nothing."""
    setup = setups["tiny-llama"]
    prompt = setup.prompts[0][:1]
    ref = run(setup.target, ARDrafter(setup.target), prompt, max_new=8).output_ids
    gen = run(setup.target, Eagle3Drafter(setup.target, Eagle3Config(path="random", **SMALL)), prompt, max_new=8)
    assert gen.output_ids == ref and gen.steps[0].tree_size == 1 and gen.steps[1].tree_size == 16


def test_scaled_rope_config_round_trip():
    """A llama3-scaled head keeps its scaling through config.json, and its RoPE is the scaled one."""
    from drafters.eagle3.model import Eagle3HeadConfig

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024}
    cfg = Eagle3HeadConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           vocab_size=384, draft_vocab_size=384, rope_theta=500000.0, rope_scaling=scaling,
                           max_position_embeddings=8192)
    again = Eagle3HeadConfig.from_config_dict(cfg.to_config_dict())
    assert again.rope_scaling == scaling and again.rope_theta == 500000.0
    plain = Eagle3Head(dataclasses.replace(cfg, rope_scaling=None))
    scaled = Eagle3Head(again)
    pos = torch.arange(0, 4000, 97)
    # llama3 scaling slows the low frequencies: the tables differ at long range
    assert not torch.allclose(plain.rope(pos, torch.float32)[0], scaled.rope(pos, torch.float32)[0])