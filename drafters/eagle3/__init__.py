"""EAGLE-3 (Li et al. 2025): a one-layer draft head over fused low/mid/high target features.

* :mod:`drafters.eagle3.model`: the head (upstream parameter names), its config, its KV cache;
* :mod:`drafters.eagle3.tree`: the dynamic top-k tree builder;
* :mod:`drafters.eagle3.checkpoint`: ``save_eagle3`` / ``load_eagle3`` in the released layout;
* :mod:`drafters.eagle3.drafter`: :class:`Eagle3Drafter`, registered as ``eagle3``.
"""

from drafters.eagle3.checkpoint import load_eagle3, save_eagle3
from drafters.eagle3.drafter import Eagle3Config, Eagle3Drafter
from drafters.eagle3.model import Eagle3Head, Eagle3HeadConfig, KVCache, default_feature_layers, new_cache, random_head
from drafters.eagle3.tree import DynamicTreeBuilder

__all__ = [
    "Eagle3Config", "Eagle3Drafter", "Eagle3Head", "Eagle3HeadConfig", "KVCache", "new_cache", "DynamicTreeBuilder",
    "default_feature_layers", "random_head", "load_eagle3", "save_eagle3",
]
