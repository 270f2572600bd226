"""TreeFlash on the 3-epoch and the 5-epoch DFlash backbone: `python sweeps/treeflash_epochs.py`.

The report, figure and README table of ``sweeps/block_vocab.py`` (whose functions this reuses) for the two
TreeFlash heads: reads ``reports/data/treeflash-epochs/`` (``specbench sweep sweeps/treeflash_epochs.toml``)
and the two heads' ``training.json``, writes ``reports/treeflash_epochs.md``,
``reports/figures/treeflash-epochs.png`` and the README's table between its own marker lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_vocab", Path(__file__).with_name("block_vocab.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

TREEFLASH_EPOCHS = base.Comparison(
    sweep=Path(__file__).with_suffix(".toml"), out=Path("reports/treeflash_epochs.md"),
    figure=Path("reports/figures/treeflash-epochs.png"),
    begin="<!-- TreeFlash backbone-epochs table: written by `python sweeps/treeflash_epochs.py`; do not edit by hand -->",
    end="<!-- end of the TreeFlash backbone-epochs table -->",
    heads=(("e3", "3-epoch backbone", Path("drafters/checkpoints/treeflash-smollm2-135m-r200k-g1bb-v8k")),
           ("e5", "5-epoch backbone", Path("drafters/checkpoints/treeflash-smollm2-135m-r200k-g1bb-e5-v8k"))),
    settings=(("16", "16 nodes"),),
    title="TreeFlash on the 8,192-id DFlash gamma-1 backbone at 200k tokens",
    intro="Both heads: TreeFlash's correction trained for 3 epochs (bf16, every anchor, 200,047 regenerated "
          "assistant tokens) on a frozen 8,192-id DFlash gamma-1 backbone; only the backbone's epochs differ "
          "(3 or 5).",
    short=("3-epoch backbone", "5-epoch backbone"), heading="A better-trained backbone against the first one",
    contrast="{a} against {b}")
COMPARISON = TREEFLASH_EPOCHS


if __name__ == "__main__":
    base.main(COMPARISON)
