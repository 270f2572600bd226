"""More epochs for the 8,192-id DFlash gamma-1 head at 200k tokens: `python sweeps/dflash_epochs.py`.

The report, figure and README table of ``sweeps/block_vocab.py`` (whose functions this reuses) for the
3-epoch and 5-epoch heads: reads ``reports/data/dflash-epochs/`` (``specbench sweep sweeps/dflash_epochs.toml``)
and the two heads' ``training.json``, writes ``reports/dflash_epochs.md``, ``reports/figures/dflash-epochs.png``
and the README's table between its own marker lines.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_vocab", Path(__file__).with_name("block_vocab.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

DFLASH_EPOCHS = base.Comparison(
    sweep=Path(__file__).with_suffix(".toml"), out=Path("reports/dflash_epochs.md"),
    figure=Path("reports/figures/dflash-epochs.png"),
    begin="<!-- DFlash epochs table: written by `python sweeps/dflash_epochs.py`; do not edit by hand -->",
    end="<!-- end of the DFlash epochs table -->",
    heads=(("e3", "3 epochs (511 steps)", Path("drafters/checkpoints/dflash-smollm2-135m-r200k-g1-v8k")),
           ("e5", "5 epochs (849 steps)", Path("drafters/checkpoints/dflash-smollm2-135m-r200k-g1-e5-v8k"))),
    settings=(("marginal-16", "marginal tree, 16 nodes"), ("chain-16", "chain (block 16)")),
    title="DFlash gamma 1, 8,192-id draft vocabulary, at 200k tokens",
    intro="Both heads: every anchor, 200,047 regenerated assistant tokens, gamma 1, bf16, `draft_vocab_size=8192`; "
          "only `epochs` differs.",
    short=("3-epoch", "5-epoch"), heading="More training steps against fewer", contrast="{a} against {b}")
COMPARISON = DFLASH_EPOCHS


if __name__ == "__main__":
    base.main(COMPARISON)
