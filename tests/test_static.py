"""The static-cache target (`--compile`'s path, run eagerly on CPU): the eager target's greedy tokens
with deep, non-contiguous accepted paths, padded buckets and feature taps; the run wiring (with
torch.compile stubbed, since CUDA graphs need CUDA); one-line refusals of --compile on a CPU."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from specbench import cli, runner, static
from specbench.decode import generate
from specbench.drafter import DraftContext, Drafter, Sampling, drafter_class, parse_config
from specbench.static import StaticTarget, bucket
from specbench.targets import load_target
from specbench.tasks import render_chat
from specbench.tree import DraftTree, TreeBuilder

PROMPTS = ["1 2 3 4 5 6", "ab ab ab ab", "List three colours."]


class OracleDrafter(Drafter):
    """Knows the greedy continuation; drafts it as a LATE branch among random decoys, so accepted
    paths are deep and non-contiguous (the commit must gather), and tree sizes vary (buckets)."""

    def __init__(self, reference: list[int], seed: int = 0, taps: tuple[int, ...] = ()):
        self.reference, self.rng = reference, random.Random(seed)
        self.feature_layers = taps
        self.features_seen = []

    def reset(self, sampling: Sampling) -> None:
        pass

    def propose(self, ctx: DraftContext) -> DraftTree:
        if ctx.features is not None:
            self.features_seen.append(ctx.features.detach().clone())
        pos = ctx.pos
        b = TreeBuilder(int(ctx.tokens[-1]))
        for _ in range(self.rng.randint(0, 5)):  # decoys first
            node = b.add(0, self.rng.randrange(384))
            if self.rng.random() < 0.5:
                b.add(node, self.rng.randrange(384))
        node = 0
        for tok in self.reference[pos + 1 : pos + 1 + self.rng.randint(1, 6)]:
            b.add(node, self.rng.randrange(384))  # a decoy sibling before each true node
            node = b.add(node, tok)
        return b.build(device=ctx.tokens.device)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen3"])
def pair(request):
    eager = load_target(request.param, "cpu")
    return eager, StaticTarget(eager, max_len=256)


def test_bucket():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 16, 17, 255, 256, 257)] == [1, 2, 4, 4, 8, 16, 32, 256, 256, 512]


def test_static_equals_eager_on_deep_non_contiguous_paths(pair):
    eager, fixed = pair
    ar = drafter_class("ar")
    for i, prompt in enumerate(PROMPTS):
        ids = torch.tensor(render_chat(eager.tokenizer, [{"role": "user", "content": prompt}]))
        ref = generate(eager, ar(eager, ar.Config()), ids, 48, Sampling()).output_ids
        assert generate(fixed, ar(fixed, ar.Config()), ids, 48, Sampling()).output_ids == ref
        full = ids.tolist() + ref
        taps = (1, 3)
        runs = []
        for tgt in (eager, fixed):
            d = OracleDrafter(full, seed=i, taps=taps)
            gen = generate(tgt, d, ids, 48, Sampling())
            runs.append((gen, d))
        (g_eager, d_eager), (g_static, d_static) = runs
        assert g_static.output_ids == g_eager.output_ids == ref
        assert [s.accepted for s in g_static.steps] == [s.accepted for s in g_eager.steps]
        assert max(s.accepted for s in g_static.steps) >= 3  # deep paths were accepted
        assert len({bucket(s.tree_size) for s in g_static.steps}) >= 2  # several buckets met
        for a, b in zip(d_eager.features_seen, d_static.features_seen):  # the feature taps agree
            assert torch.allclose(a, b, atol=1e-4)


def test_static_equals_eager_with_a_learned_drafter(pair):
    eager, fixed = pair
    cls = drafter_class("eagle3")
    config = parse_config(cls.Config, ["path=random", "total_tokens=12", "depth=4", "top_k=3"])
    ids = torch.tensor(render_chat(eager.tokenizer, [{"role": "user", "content": "ab ab ab ab"}]))
    outs = [generate(t, cls(t, config), ids, 40, Sampling()).output_ids for t in (eager, fixed)]
    assert outs[0] == outs[1]


def test_static_cache_refuses_what_does_not_fit(pair):
    _, fixed = pair
    with pytest.raises(Exception, match="does not fit"):
        fixed.prefill(torch.zeros(300, dtype=torch.long))


def test_compile_is_refused_on_cpu_in_one_line(tmp_path):
    for args in (["run", "--target", "tiny-llama", "--compile", "--device", "cpu", "--results-dir", tmp_path],
                 ["profile", "--target", "tiny-llama", "--name", "x", "--compile", "--device", "cpu"]):
        res = CliRunner().invoke(cli.app, [str(a) for a in args])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and "needs a CUDA device" in lines[0], res.output


def test_run_with_compile_wiring(tmp_path, monkeypatch):
    """runner.run with --compile on CPU, torch.compile stubbed out: the static target runs the drafter
    and its own baseline, the rows say how the target ran, and the tokens equal an eager run's."""
    monkeypatch.setattr(static, "check_compile", lambda device: None)
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    spec = runner.RunSpec(drafter="ngram", target="tiny-llama", task="humaneval", limit=2, max_new_tokens=16,
                          options=("min_n=1",), device="cpu", results_dir=tmp_path, warmup=False)
    plain = runner.run(runner.RunSpec(**{**spec.__dict__, "out": tmp_path / "eager.parquet"}),
                       lambda s: load_target(s.target, s.device, s.dtype))
    compiled = runner.run(runner.RunSpec(**{**spec.__dict__, "compile": True, "out": tmp_path / "compiled.parquet"}),
                          lambda s: load_target(s.target, s.device, s.dtype))
    assert compiled.baseline_source == "ran"  # never a baseline measured on another forward
    df = pd.read_parquet(tmp_path / "compiled.parquet")
    assert set(df["target_mode"]) == {"static+cudagraph"}
    assert [list(r["output_ids"]) for r in compiled.rows] == [list(r["output_ids"]) for r in plain.rows]
    base = pd.read_parquet(tmp_path / "compiled.ar-baseline.parquet")
    assert set(base["target_mode"]) == {"static+cudagraph"}
