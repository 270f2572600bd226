"""Shipped regenerated answers: exported from a local cache, read as a seed before generating,
ignored with a warning when torn or made with other settings; the export script."""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import json
import warnings
from pathlib import Path

import pytest

from specbench.targets import load_target
from specbench.train.regenerate import (
    SHIPPED_DIR, RegenConfig, ShippedAnswersWarning, cache_path, export_shipped, read_shipped, regenerate, shipped_path,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def target():
    return load_target("tiny-llama", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def ds():
    from datasets import Dataset

    from specbench.train.data import conversation_features

    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i} " * 3},
                                         {"role": "assistant", "content": "old answer"}]} for i in range(10)]
    return Dataset.from_list(rows, features=conversation_features())


CFG = RegenConfig(max_new_tokens=5, batch_size=4)


def test_exported_answers_seed_a_fresh_machine(target, ds, tmp_path):
    shipped = tmp_path / "shipped"
    first, st = regenerate(ds, target, tmp_path / "a", 20, 256, CFG, shipped_dir=shipped)
    assert st.n_generated > 0
    out, n = export_shipped(target, CFG, tmp_path / "a", shipped)
    assert out == shipped_path(target, CFG, shipped) and n == st.n_generated
    assert out.name.startswith("tiny-llama-") and out.name.endswith(".jsonl.gz")
    # the local cache's key is the shipped file's
    assert out.name.removesuffix(".jsonl.gz").split("-")[-1] == cache_path(tmp_path, target, CFG).stem.split("-")[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, st2 = regenerate(ds, target, tmp_path / "b", 20, 256, CFG, shipped_dir=shipped)  # a fresh cache
    assert st2.n_generated == 0 and again.to_list() == first.to_list()
    # a larger budget generates only what is missing, and a second export keeps the shipped rows
    _, st3 = regenerate(ds, target, tmp_path / "b", 40, 256, CFG, shipped_dir=shipped)
    assert 0 < st3.n_generated
    out2, n2 = export_shipped(target, CFG, tmp_path / "b", shipped)
    assert n2 == n + st3.n_generated
    assert export_shipped(target, CFG, tmp_path / "b", shipped)[1] == n2
    before = out2.read_bytes()
    export_shipped(target, CFG, tmp_path / "b", shipped)
    assert out2.read_bytes() == before  # deterministic bytes


def _ship(target, ds, tmp_path) -> Path:
    shipped = tmp_path / "shipped"
    regenerate(ds, target, tmp_path / "a", 20, 256, CFG, shipped_dir=shipped)
    return export_shipped(target, CFG, tmp_path / "a", shipped)[0]


def test_torn_file_is_ignored_with_a_warning(target, ds, tmp_path):
    out = _ship(target, ds, tmp_path)
    data = out.read_bytes()
    out.write_bytes(data[: len(data) // 2])
    with pytest.warns(ShippedAnswersWarning, match="unreadable"):
        _, st = regenerate(ds, target, tmp_path / "fresh", 20, 256, CFG, shipped_dir=out.parent)
    assert st.n_generated > 0


def test_mismatched_header_is_ignored_with_a_warning(target, ds, tmp_path):
    out = _ship(target, ds, tmp_path)
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    header = json.loads(lines[0])
    header["key"]["max_new_tokens"] = 99
    out.write_bytes(gzip.compress("\n".join([json.dumps(header), *lines[1:]]).encode() + b"\n"))
    with pytest.warns(ShippedAnswersWarning, match="other settings"):
        assert read_shipped(target, CFG, out.parent) == {}


def test_answers_for_other_settings_warn_and_are_not_used(target, ds, tmp_path):
    out = _ship(target, ds, tmp_path)
    other = RegenConfig(max_new_tokens=7, batch_size=4)
    with pytest.warns(ShippedAnswersWarning, match="not for these settings"):
        assert read_shipped(target, other, out.parent) == {}


def test_no_shipped_answers_is_silent(target, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_shipped(target, CFG, tmp_path / "none") == {}
        assert read_shipped(target, CFG) == {}  # nothing ships for tiny targets
    assert (SHIPPED_DIR / "README.md").is_file()


def _script():
    path = ROOT / "scripts" / "export-regenerated"
    loader = importlib.machinery.SourceFileLoader("export_regenerated", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_export_script(target, ds, tmp_path, capsys):
    script = _script()
    args = ["--target", "tiny-llama", "--max-new-tokens", "5", "--cache-dir", str(tmp_path / "a"),
            "--out-dir", str(tmp_path / "out")]
    assert script.main(args) == 1  # nothing regenerated yet: one line, non-zero
    err = capsys.readouterr().err
    assert err.startswith("error: no regenerated answers") and err.count("\n") == 1
    regenerate(ds, target, tmp_path / "a", 20, 256, CFG)
    assert script.main(args) == 0
    assert shipped_path(target, CFG, tmp_path / "out").exists()


def test_digest_ignores_where_the_model_was_loaded_from(tmp_path):
    """The same weights in two cache folders (a fresh machine's cache is elsewhere) are one target: the
    shipped answers and the feature caches must apply to both. A changed weight is another target."""
    from specbench.targets import Target
    from specbench.train.regenerate import target_digest

    tiny = load_target("tiny-llama", device="cpu", dtype="float32")
    loaded = []
    for where in ("a", "b"):
        tiny.model.save_pretrained(tmp_path / where)
        tiny.tokenizer.save_pretrained(tmp_path / where)
        t = load_target(str(tmp_path / where), device="cpu", dtype="float32")
        assert t.model.config._name_or_path == str(tmp_path / where)  # the path is on the config, and differs
        loaded.append(Target("tiny-llama", t.model, t.tokenizer, t.stop_token_ids))
    assert target_digest(loaded[0]) == target_digest(loaded[1])
    assert shipped_path(loaded[0], CFG) == shipped_path(loaded[1], CFG)
    with __import__("torch").no_grad():
        next(loaded[1].model.parameters()).flatten()[0] += 1.0
    assert target_digest(loaded[0]) != target_digest(loaded[1])
