"""The block claims table with the 7-epoch 8k heads: `python sweeps/block_e7.py`.

The same cells, rules, report and figure as ``sweeps/block_r200k.py`` (whose functions this reuses), on
the best block heads trained so far (gamma 1, the 8,192-id draft vocabulary, 7 epochs): reads
``reports/data/block-e7/`` (``specbench sweep sweeps/block_e7.toml``) and writes ``reports/block_e7.md``,
``reports/figures/block-e7-budget.png`` and the README's third claims table, between its own pair of
marker lines (``tests/test_sweep.py`` checks that the README's table is what this data gives). Tasks
not measured yet show as "-" and their claims as "not measured yet".
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("block_r200k", Path(__file__).with_name("block_r200k.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)

SWEEP = Path(__file__).with_suffix(".toml")
OUT = Path("reports/block_e7.md")
FIGURE = Path("reports/figures/block-e7-budget.png")
HEADS = ("`drafters/checkpoints/dflash-smollm2-135m-r200k-g1-e7-v8k`, `jetspec-smollm2-135m-r200k-g1-e7-v8k` and "
         "`treeflash-smollm2-135m-r200k-g1bb-e7-v8k` (TreeFlash on the frozen DFlash e7 head; every anchor, 200k "
         "regenerated assistant tokens, gamma 1, 8,192 draft ids, 7 epochs for the two backbones and 3 for the "
         "TreeFlash stage; their TRAINING.md cards)")
TITLE = "Block drafters with gamma 1, 8k draft ids and 7 epochs at 200k tokens"
README_BEGIN = "<!-- 7-epoch claims table: written by `python sweeps/block_e7.py`; do not edit by hand -->"
README_END = "<!-- end of the 7-epoch claims table -->"

# the test and the writer use the same functions as the gamma-7 table
summaries, readme_table = base.summaries, base.readme_table


def readme_with_table(text: str, table: list[str]) -> str:
    return base.readme_with_table(text, table, README_BEGIN, README_END)


def main() -> None:
    base.main(SWEEP, OUT, FIGURE, HEADS, TITLE, README_BEGIN, README_END)


if __name__ == "__main__":
    main()
