"""The parts every learned drafter family shares (one copy each, no family keeps its own).

* :mod:`~drafters.common.nn`: RMSNorm, rotate_half, the gated (SwiGLU) MLP, seeded random init;
* :mod:`~drafters.common.rope`: RoPE built by transformers' own initialisation, so every
  ``rope_scaling`` type the target uses (llama3, yarn, linear, ...) is honoured;
* :mod:`~drafters.common.kv_cache`: one draft KV cache with append, crop and roll-back;
* :mod:`~drafters.common.shape`: a drafter layer shaped like the target's (``target_shape``);
* :mod:`~drafters.common.loading`: config.json reading, the target check, the checked state-dict
  loader, and the lookup of checkpoints that ship for a target.
* :mod:`~drafters.common.locate`: where a checkpoint folder is (``--drafter-path`` as given, else under
  the project root; the folder a finished run loaded), torch-free so ``compare`` can use it.
* :mod:`~drafters.common.vocab`: a reduced draft vocabulary (the most frequent training tokens)
  and its d2t / t2d maps (EAGLE-3's head, the block families' ``draft_vocab_size`` variant).

The newly committed rows a drafter conditions on (tokens, features, positions) come from
:meth:`specbench.drafter.DraftContext.new_rows`.
"""
