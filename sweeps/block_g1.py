"""The block claims table with the gamma-1 heads: `python sweeps/block_g1.py`.

The same cells, rules, report and figure as ``sweeps/block_r200k.py`` (whose functions this reuses), on
the heads trained with gamma 1 (the block loss's depth weight): reads ``reports/data/block-g1/``
(``specbench sweep sweeps/block_g1.toml``) and writes ``reports/block_g1.md``,
``reports/figures/block-g1-budget.png`` and the README's second claims table, between its own pair of
marker lines (``tests/test_sweep.py`` checks that the README's table is what this data gives).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_r200k", Path(__file__).with_name("block_r200k.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

SWEEP = Path(__file__).with_suffix(".toml")
OUT = Path("reports/block_g1.md")
FIGURE = Path("reports/figures/block-g1-budget.png")
HEADS = ("`drafters/checkpoints/dflash-smollm2-135m-r200k-g1`, `jetspec-smollm2-135m-r200k-g1` and "
         "`treeflash-smollm2-135m-r200k-g1bb` (TreeFlash on the frozen DFlash gamma-1 head; every anchor, 200k "
         "regenerated assistant tokens, gamma 1; their TRAINING.md cards)")
TITLE = "Block drafters with gamma 1 at 200k tokens"
README_BEGIN = "<!-- gamma-1 claims table: written by `python sweeps/block_g1.py`; do not edit by hand -->"
README_END = "<!-- end of the gamma-1 claims table -->"

# the test and the writer use the same functions as the gamma-7 table
summaries, readme_table = base.summaries, base.readme_table


def readme_with_table(text: str, table: list[str]) -> str:
    return base.readme_with_table(text, table, README_BEGIN, README_END)


def main() -> None:
    base.main(SWEEP, OUT, FIGURE, HEADS, TITLE, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
