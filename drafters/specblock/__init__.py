"""SpecBlock (shiweijiezero/SpecBlock): K-slot block drafting with shift injection and a rank head.

* :mod:`drafters.specblock.model`: the model (upstream parameter names) and its config;
* :mod:`drafters.specblock.tree`: the rank-driven tree grown from block outputs;
* :mod:`drafters.specblock.checkpoint`: ``save_specblock`` / ``read_specblock`` in the released layout;
* :mod:`drafters.specblock.drafter`: :class:`SpecBlockDrafter`, registered as ``specblock``;
* :mod:`drafters.specblock.train`: the trainable for ``specbench train --drafter specblock``;
* :mod:`drafters.specblock.adapt`: the cost-aware online adaptation of the rank head.
"""

from drafters.specblock.drafter import SpecBlockDrafter, SpecBlockOptions

__all__ = ["SpecBlockDrafter", "SpecBlockOptions"]
