"""JetSpec with the reduced draft vocabulary next to the full one: `python sweeps/jetspec_vocab.py`.

The report, figure and README table of ``sweeps/block_vocab.py`` (whose functions this reuses) for the
JetSpec pair: reads ``reports/data/jetspec-vocab/`` (``specbench sweep sweeps/jetspec_vocab.toml``) and the
two heads' ``training.json``, writes ``reports/jetspec_vocab.md``, ``reports/figures/jetspec-vocab.png`` and
the README's table between its own marker lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_vocab", Path(__file__).with_name("block_vocab.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

JETSPEC = base.Comparison(
    sweep=Path(__file__).with_suffix(".toml"), out=Path("reports/jetspec_vocab.md"),
    figure=Path("reports/figures/jetspec-vocab.png"),
    begin="<!-- JetSpec draft-vocabulary table: written by `python sweeps/jetspec_vocab.py`; do not edit by hand -->",
    end="<!-- end of the JetSpec draft-vocabulary table -->",
    heads=(("full", "full (49,152 ids)", Path("drafters/checkpoints/jetspec-smollm2-135m-r200k-g1")),
           ("v8k", "8,192 ids", Path("drafters/checkpoints/jetspec-smollm2-135m-r200k-g1-v8k"))),
    settings=(("tree-16", "cumulative-log-prob tree, 16 nodes"), ("chain-16", "chain (width 1, 16 nodes)"),
              ("tree-64", "cumulative-log-prob tree, 64 nodes")),
    title="JetSpec gamma 1 at 200k tokens",
    intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, 3 epochs; only "
          "`draft_vocab_size` differs.")
COMPARISON = JETSPEC


if __name__ == "__main__":
    base.main(COMPARISON)
