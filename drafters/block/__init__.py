"""Block drafters on one backbone: DFlash, JetSpec and TreeFlash.

* :mod:`drafters.block.model`: the shared backbone (context injection, mask token, context cache);
* :mod:`drafters.block.tree`: chain, JetSpec's accum-log-prob tree, the lazy k-best tree;
* :mod:`drafters.block.checkpoint`: the released layouts (z-lab DFlash, JetSpec, TreeFlash);
* :mod:`drafters.block.drafter`: the three drafters;
* :mod:`drafters.block.train`: their training through `specbench train`.
"""

from drafters.block.drafter import DFlashDrafter, JetSpecDrafter, TreeFlashDrafter

__all__ = ["DFlashDrafter", "JetSpecDrafter", "TreeFlashDrafter"]
