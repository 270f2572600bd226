"""TreeFlash with the reduced draft vocabulary next to the full one: `python sweeps/treeflash_vocab.py`.

The report, figure and README table of ``sweeps/block_vocab.py`` (whose functions this reuses) for the
TreeFlash pair: reads ``reports/data/treeflash-vocab/`` (``specbench sweep sweeps/treeflash_vocab.toml``)
and the two heads' ``training.json``, writes ``reports/treeflash_vocab.md``,
``reports/figures/treeflash-vocab.png`` and the README's table between its own marker lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_vocab", Path(__file__).with_name("block_vocab.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

TREEFLASH = base.Comparison(
    sweep=Path(__file__).with_suffix(".toml"), out=Path("reports/treeflash_vocab.md"),
    figure=Path("reports/figures/treeflash-vocab.png"),
    begin="<!-- TreeFlash draft-vocabulary table: written by `python sweeps/treeflash_vocab.py`; do not edit by hand -->",
    end="<!-- end of the TreeFlash draft-vocabulary table -->",
    heads=(("full", "full (49,152 ids)", Path("drafters/checkpoints/treeflash-smollm2-135m-r200k-g1bb")),
           ("v8k", "8,192 ids", Path("drafters/checkpoints/treeflash-smollm2-135m-r200k-g1bb-v8k"))),
    settings=(("16", "16 nodes"),),
    title="TreeFlash on the gamma-1 backbone at 200k tokens",
    intro="Both heads: TreeFlash's correction trained on a frozen DFlash gamma-1 backbone (full vocabulary, or "
          "its 8,192-id twin), every anchor, 200,047 regenerated assistant tokens, bf16, 3 epochs.")
COMPARISON = TREEFLASH


if __name__ == "__main__":
    base.main(COMPARISON)
