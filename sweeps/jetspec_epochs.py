"""More epochs for the 8,192-id JetSpec gamma-1 head at 200k tokens: `python sweeps/jetspec_epochs.py`.

The report, figure and README table of ``sweeps/block_vocab.py`` (whose functions this reuses) for the
3-epoch and 5-epoch heads: reads ``reports/data/jetspec-epochs/`` (``specbench sweep sweeps/jetspec_epochs.toml``)
and the two heads' ``training.json``, writes ``reports/jetspec_epochs.md``, ``reports/figures/jetspec-epochs.png``
and the README's table between its own marker lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_vocab", Path(__file__).with_name("block_vocab.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

JETSPEC_EPOCHS = base.Comparison(
    sweep=Path(__file__).with_suffix(".toml"), out=Path("reports/jetspec_epochs.md"),
    figure=Path("reports/figures/jetspec-epochs.png"),
    begin="<!-- JetSpec epochs table: written by `python sweeps/jetspec_epochs.py`; do not edit by hand -->",
    end="<!-- end of the JetSpec epochs table -->",
    heads=(("e3", "3 epochs (511 steps)", Path("drafters/checkpoints/jetspec-smollm2-135m-r200k-g1-v8k")),
           ("e5", "5 epochs (849 steps)", Path("drafters/checkpoints/jetspec-smollm2-135m-r200k-g1-e5-v8k"))),
    settings=(("tree-16", "cumulative-log-prob tree, 16 nodes"), ("tree-64", "cumulative-log-prob tree, 64 nodes")),
    title="JetSpec gamma 1, 8,192-id draft vocabulary, at 200k tokens",
    intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, `draft_vocab_size=8192`; "
          "only `epochs` differs; the soft labels are the target's distribution restricted to the 8,192 ids.",
    short=("3-epoch", "5-epoch"), heading="More training steps against fewer", contrast="{a} against {b}")
COMPARISON = JETSPEC_EPOCHS


if __name__ == "__main__":
    base.main(COMPARISON)
