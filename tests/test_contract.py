"""The drafter contract (specbench/drafter.py) and the registry, seen from outside specbench.

* the README's "Adding a drafter" example, installed as a third-party package (a dist-info with an
  entry point on sys.path), is found by the registry, listed by ``specbench drafters``, collected
  by the conformance suite, and passes its greedy and sampled checks;
* the registry refuses classes that break the contract, in one line;
* a run records the identity (sha256, path) of the weights a learned drafter loaded, and two
  heads never share it.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from specbench.decode import generate
from specbench.drafter import Drafter, Sampling, available_drafters, drafter_class, parse_config, takes_checkpoint
from specbench.errors import UserError

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    section = README.read_text().split("## Adding a drafter", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def install(tmp_path: Path, monkeypatch, module: str, source: str, entry: str) -> None:
    """A minimal installed distribution: the module plus a dist-info naming its entry point."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[specbench.drafters]\n{entry}\n")
    monkeypatch.syspath_prepend(str(site))


@pytest.fixture
def bigram(tmp_path, monkeypatch):
    install(tmp_path, monkeypatch, "my_drafters", readme_example(), "bigram = my_drafters:BigramDrafter")
    yield drafter_class("bigram")
    sys.modules.pop("my_drafters", None)


def test_readme_example_is_a_conforming_third_party_drafter(bigram):
    import test_conformance as conformance

    assert "bigram" in available_drafters() and issubclass(bigram, Drafter) and not takes_checkpoint(bigram)
    assert bigram.training() is None and bigram.checkpoint is None
    cases = [c for c, _ in conformance.cases() if c.drafter == "bigram"]
    assert [c.options for c in cases] == [(), ("num_draft=8",)]  # collected from its test_options
    setup = conformance.Setup("tiny-llama")
    drafted = 0
    for case in cases:
        drafter = conformance.build(setup, case, Path("/nonexistent"))
        for prompt, ref in zip(setup.prompts, setup.reference):
            gen = generate(setup.target, drafter, prompt, conformance.MAX_NEW, Sampling())
            assert gen.output_ids == ref
            drafted += sum(s.tree_size - 1 for s in gen.steps)
    assert drafted > 100  # drafts were proposed and verified, so the equality above tests something


def test_third_party_drafter_in_the_cli(bigram, wide_console):
    from typer.testing import CliRunner

    from specbench.cli import app

    res = CliRunner().invoke(app, ["drafters"])
    assert res.exit_code == 0 and "bigram" in res.output and "num_draft=4" in res.output


class NotADrafter:
    @dataclasses.dataclass(frozen=True)
    class Config:
        pass


class NoDefaults(Drafter):
    @dataclasses.dataclass(frozen=True)
    class Config:
        budget: int

    def __init__(self, target, config):
        pass

    def reset(self, sampling):
        pass

    def propose(self, ctx):
        raise NotImplementedError


@pytest.mark.parametrize("cls,words", [("NotADrafter", "does not subclass specbench.drafter.Drafter"),
                                       ("NoDefaults", "Config must be a dataclass with a default for every field")])
def test_registry_refuses_broken_drafters(tmp_path, monkeypatch, cls, words):
    install(tmp_path, monkeypatch, "broken_drafters", f"from test_contract import {cls}\n",
            f"broken = broken_drafters:{cls}")
    with pytest.raises(UserError, match=words):
        drafter_class("broken")
    sys.modules.pop("broken_drafters", None)


def test_contract_defaults():
    ar = drafter_class("ar")
    assert ar.training() is None and ar.feature_layers == () and not takes_checkpoint(ar)
    assert takes_checkpoint(drafter_class("eagle3")) and drafter_class("eagle3").training() is not None
    with pytest.raises(TypeError):
        Drafter(None, None)  # abstract: reset and propose are required


def test_runs_record_the_weights_they_loaded(tmp_path, wide_console):
    """Two random heads (seeds 0 and 1) get different sha256s, the same seed the same one, and
    resuming a run with another head is refused."""
    import pandas as pd

    from specbench import runner
    from specbench.targets import load_target

    def run(seed: int, out: str, resume: bool = False):
        spec = runner.RunSpec(drafter="eagle3", target="tiny-llama", task="humaneval", limit=1, max_new_tokens=4,
                              options=("path=random", f"seed={seed}", "depth=2", "top_k=2", "total_tokens=4"),
                              out=tmp_path / out, results_dir=tmp_path, baseline=False, warmup=False, resume=resume)
        return runner.run(spec, lambda s: load_target(s.target, device="cpu", dtype="float32"))

    rows = [pd.read_parquet(run(seed, f"{i}.parquet").out) for i, seed in enumerate((0, 1, 0))]
    hashes = [r["checkpoint_hash"].iloc[0] for r in rows]
    assert all(len(h) == 64 for h in hashes) and hashes[0] != hashes[1] and hashes[0] == hashes[2]
    assert rows[0]["checkpoint_path"].iloc[0] == "random:seed=0"
    cls = drafter_class("eagle3")
    head = cls(load_target("tiny-llama", device="cpu", dtype="float32"), parse_config(cls.Config, ["path=random"]))
    assert head.checkpoint.sha256 == hashes[0]


def test_a_drafter_path_is_read_as_given_else_under_the_project_root(tmp_path, monkeypatch):
    """``--drafter-path drafters/checkpoints/...`` (what sweeps record) loads from any folder: a path that
    exists where the command runs wins; otherwise the same relative path under the project root; a path
    found in neither is named in a one-line error."""
    from drafters.common import locate
    from drafters.eagle3 import random_head, save_eagle3
    from specbench.targets import load_target

    target = load_target("tiny-llama", device="cpu", dtype="float32")
    cls = drafter_class("eagle3")
    root, here = tmp_path / "project", tmp_path / "elsewhere"
    save_eagle3(random_head(target, seed=0), root / "heads" / "h")
    here.mkdir()
    monkeypatch.setattr(locate, "project_root", lambda: root)
    monkeypatch.chdir(here)

    rooted = cls(target, parse_config(cls.Config, ["path=heads/h"]))
    assert rooted.checkpoint.path == str(root / "heads" / "h")
    save_eagle3(random_head(target, seed=1), here / "heads" / "h")
    local = cls(target, parse_config(cls.Config, ["path=heads/h"]))
    assert local.checkpoint.path == "heads/h" and local.checkpoint.sha256 != rooted.checkpoint.sha256
    with pytest.raises(UserError, match="'heads/none' is not a directory"):
        cls(target, parse_config(cls.Config, ["path=heads/none"]))


def test_a_missing_checkpoint_folder_is_refused_before_the_target_loads(tmp_path):
    """A --drafter-path that is no folder (here or under the project root) is a one-line error before the
    target is fetched or loaded (a real target takes tens of seconds to convert on first use)."""
    from specbench import runner

    def load_target(spec):
        raise AssertionError("the target was loaded before the checkpoint path was checked")

    for path in (tmp_path / "no-head", Path("drafters/checkpoints/no-such-head")):
        spec = runner.RunSpec(drafter="eagle3", target="tiny-llama", task="humaneval", limit=1, max_new_tokens=4,
                              drafter_path=path, out=tmp_path / "run.parquet")
        with pytest.raises(UserError, match="no-.*head' is not a directory; pass the folder holding config.json"):
            runner.run(spec, load_target)
    assert not (tmp_path / "run.parquet").exists()
    # the same path given as a drafter option is checked as early, and the drafter's own values pass
    spec = runner.RunSpec(drafter="dflash", target="tiny-llama", task="humaneval", limit=1, max_new_tokens=4,
                          options=("budget=8", f"path={tmp_path / 'no-head'}"), out=tmp_path / "run.parquet")
    with pytest.raises(UserError, match="dflash checkpoint '.*no-head' is not a directory"):
        runner.run(spec, load_target)
    for value in ("auto", "random"):
        runner.check_checkpoint_exists(dataclasses.replace(spec, options=(f"path={value}",)))
    # a shipped folder given relative to the project root passes the check from any working folder
    spec = runner.RunSpec(drafter="eagle3", target="tiny-llama", task="humaneval", limit=1,
                          drafter_path=Path("drafters/checkpoints/eagle3-smollm2-135m-r200k"))
    runner.check_checkpoint_exists(spec)
    # the sweep-time check (validate) does not ask for the folder: a sweep may name heads it trains first
    assert runner.validate(dataclasses.replace(spec, drafter_path=tmp_path / "no-head"))


def test_resume_with_other_weights_at_the_same_path_is_refused(tmp_path, wide_console):
    from drafters.eagle3 import random_head, save_eagle3
    from specbench import runner
    from specbench.targets import load_target

    target = load_target("tiny-llama", device="cpu", dtype="float32")
    head_dir = tmp_path / "head"
    spec = runner.RunSpec(drafter="eagle3", target="tiny-llama", task="humaneval", limit=1, max_new_tokens=4,
                          options=(f"path={head_dir}", "depth=2", "top_k=2", "total_tokens=4"),
                          out=tmp_path / "run.parquet", results_dir=tmp_path, baseline=False, warmup=False)
    save_eagle3(random_head(target, seed=0), head_dir)
    runner.run(spec, lambda s: target)
    save_eagle3(random_head(target, seed=1), head_dir)  # same path and options, other weights
    with pytest.raises(UserError, match="checkpoint_hash"):
        runner.run(dataclasses.replace(spec, resume=True), lambda s: target)


def _slugs(text: str) -> set[str]:
    """The anchors GitHub derives from a markdown file's headings (lower case, punctuation dropped, spaces to hyphens)."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_links_between_the_readme_and_its_notes_resolve():
    """Every relative link in the README and in the notes under reports/ (the README's results in full) names a file
    that exists, and a link with an anchor names a heading of that file: moving a section between them cannot leave
    a dead link behind."""
    root = README.parent
    docs = [README, *sorted((root / "reports").glob("*.md"))]
    notes = {"eagle3.md", "block-drafters.md", "specblock.md", "training-free.md", "hardware.md", "README.md"}
    assert notes <= {d.name for d in docs[1:]}
    dead, checked = [], 0
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if target.startswith(("http://", "https://", "#")):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve()
            checked += 1
            if not dest.exists():
                dead.append(f"{doc.name}: {target} (no such file)")
            elif anchor and anchor not in _slugs(dest.read_text()):
                dead.append(f"{doc.name}: {target} (no such heading)")
    assert checked >= 30 and dead == []
    readme = README.read_text()  # the README links every note
    assert all(f"](reports/{n})" in readme for n in notes - {"README.md"})


def test_readme_links_to_its_own_sections_resolve():
    """Every `](#anchor)` in the README (its contents line among them) names a heading that exists, by the
    anchor GitHub derives from the heading's text (lower case, punctuation dropped, spaces to hyphens)."""
    text = README.read_text()
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) >= 10  # the contents line
    assert [a for a in links if a not in slugs] == []
    assert "metrics-defined-once-in-specbenchreportpy" in slugs  # backticks, commas and slashes drop out
