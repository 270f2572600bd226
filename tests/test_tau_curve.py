"""The tau-vs-training-tokens figure on synthetic results and training cards."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from rowfactory import synthetic_row
from specbench.errors import UserError
from specbench.results import RunWriter
from specbench.train.curve import checkpoint_hash, curve_points, plot_curve

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def checkpoint(root: Path, name: str, tokens: int, vocab: int = 0, weights: bytes = b"w") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights + name.encode())
    recipe = {"draft_vocab_size": vocab} if vocab else {}
    (folder / "training.json").write_text(json.dumps({"finished": True, "train_loss_tokens": tokens,
                                                      "job": {"budget_tokens": tokens, "recipe": recipe}}))
    return folder


def rows_for(folder: Path | None, drafter: str, accepted: list[int], task: str = "humaneval", config: dict | None = None,
             path: str | None = None) -> list[dict]:
    cfg = json.dumps({"path": str(folder) if folder else "random", **(config or {})})
    tag = f"{drafter}-{folder.name if folder else 'random'}-{task}"
    return [synthetic_row(f"{tag}-p{i}", 0, accepted, drafter=drafter, drafter_config=cfg, task=task,
                          checkpoint_path=path if path is not None else (str(folder) if folder else "random:seed=0"),
                          checkpoint_hash=checkpoint_hash(folder) if folder else "abc") for i in range(3)]


@pytest.fixture
def synthetic(tmp_path):
    ck = tmp_path / "ck"
    rows = []
    for tokens, acc in ((5_000, 1), (50_000, 2), (200_000, 3)):
        rows += rows_for(checkpoint(ck, f"eagle3-{tokens}", tokens), "eagle3", [acc] * 4)
        rows += rows_for(checkpoint(ck, f"dflash-{tokens}", tokens), "dflash", [acc - 1] * 4, config={"tree": "marginal"})
        rows += rows_for(checkpoint(ck, f"dflash-v-{tokens}", tokens, vocab=8192), "dflash", [acc] * 4,
                         config={"tree": "marginal"})
    rows += rows_for(None, "dflash", [0] * 4)  # random weights: left out
    return ck, rows


def test_points_join_results_to_training_cards(synthetic):
    ck, rows = synthetic
    points, left_out = curve_points(pd.DataFrame(rows))
    assert left_out == 3
    assert sorted(points["label"].unique()) == ["dflash tree=marginal", "dflash tree=marginal vocab=8192", "eagle3"]
    eagle = points[points["label"] == "eagle3"]
    assert eagle["tokens"].tolist() == [5_000, 50_000, 200_000]
    assert eagle["tau"].tolist() == pytest.approx([2.0, 3.0, 4.0])  # accepted a per step: tau a + 1
    assert points[points["label"] == "dflash tree=marginal"]["tau"].tolist() == pytest.approx([1.0, 2.0, 3.0])


def test_results_from_elsewhere_match_by_weight_hash(synthetic):
    ck, rows = synthetic
    moved = [dict(r, checkpoint_path="/elsewhere/" + Path(r["checkpoint_path"]).name) for r in rows]
    points, left_out = curve_points(pd.DataFrame(moved))
    assert points.empty and left_out == len(moved)
    points, left_out = curve_points(pd.DataFrame(moved), sorted(ck.iterdir()))
    assert len(points) == 9 and left_out == 3


def test_a_kept_card_without_weights_matches_by_its_recorded_hash(synthetic, tmp_path):
    """A curve point whose weights are gone (a fresh machine) still joins its card: the hash its
    training recorded in training.json (``checkpoint_sha256``) stands for the weights."""
    ck, rows = synthetic
    kept = tmp_path / "kept"
    for folder in sorted(ck.iterdir()):
        summary = json.loads((folder / "training.json").read_text())
        (kept / folder.name).mkdir(parents=True)
        (kept / folder.name / "training.json").write_text(
            json.dumps({**summary, "checkpoint_sha256": checkpoint_hash(folder)}))
    moved = [dict(r, checkpoint_path="heads/" + Path(r["checkpoint_path"]).name) for r in rows]
    points, left_out = curve_points(pd.DataFrame(moved), sorted(kept.iterdir()))
    assert len(points) == 9 and left_out == 3
    assert sorted(points["tokens"].unique()) == [5_000, 50_000, 200_000]
    # a card that recorded another hash matches nothing
    for folder in kept.iterdir():
        summary = json.loads((folder / "training.json").read_text())
        (folder / "training.json").write_text(json.dumps({**summary, "checkpoint_sha256": "0" * 64}))
    assert curve_points(pd.DataFrame(moved), sorted(kept.iterdir()))[0].empty


def test_figure_and_script(synthetic, tmp_path, capsys):
    ck, rows = synthetic
    rows += [dict(r, task="math500", prompt_id=r["prompt_id"] + "-m") for r in rows]
    writer = RunWriter(tmp_path / "res.parquet", resume=False)
    writer.add(rows)
    writer.finish()
    loader = importlib.machinery.SourceFileLoader("tau_curve", str(ROOT / "scripts" / "tau-curve"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    script = importlib.util.module_from_spec(spec)
    loader.exec_module(script)
    out = tmp_path / "fig.png"
    assert script.main([str(tmp_path / "res.parquet"), "--checkpoints", str(ck / "*"), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG and len(out.read_bytes()) > 5000
    table = pd.read_csv(out.with_suffix(".csv"))
    assert len(table) == 18 and set(table["task"]) == {"humaneval", "math500"}
    assert "| eagle3 | humaneval | 200,000 | 4.000 | 3 |" in capsys.readouterr().out
    with pytest.raises(UserError, match="no result row ran a checkpoint"):
        plot_curve(curve_points(pd.DataFrame(rows_for(None, "dflash", [1])))[0], tmp_path / "none.png")
    assert script.main([str(tmp_path / "missing.parquet")]) == 1


@pytest.mark.parametrize("family", ["eagle3", "dflash", "jetspec", "treeflash", "specblock"])
def test_a_training_card_records_the_hash_a_benchmark_row_will_carry(family, tmp_path):
    """What training writes as ``checkpoint_sha256`` (``checkpoint_hash`` of the folder) is the
    sha256 the drafter records when it loads the folder, for every learned family and every file its
    saver writes (SpecBlock's ``vocab_mapping.pt`` included): otherwise the curve cannot join a
    result row to a card whose weights are gone."""
    import torch

    from drafters.block.checkpoint import save_block
    from drafters.eagle3 import save_eagle3
    from drafters.specblock.checkpoint import save_specblock
    from specbench.drafter import drafter_class, parse_config
    from specbench.targets import load_target

    target = load_target("tiny-llama", device="cpu", dtype="float32")
    cls = drafter_class(family)
    vocab = ["draft_vocab_size=64"] if family in ("eagle3", "specblock") else []
    random = cls(target, parse_config(cls.Config, ["path=random", "seed=3", *vocab]))
    folder = tmp_path / family
    if family == "eagle3":
        save_eagle3(random.head.to(torch.float16), folder)
    elif family == "specblock":
        save_specblock(random.model.to(torch.float16), folder)
    else:
        save_block(random.model.to(torch.float16), folder, family)
    loaded = cls(target, parse_config(cls.Config, [f"path={folder}"]))
    assert loaded.checkpoint.sha256 == checkpoint_hash(folder)
    assert loaded.checkpoint.sha256 != random.checkpoint.sha256
