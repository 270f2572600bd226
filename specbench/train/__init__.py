"""Shared training for learned drafters: data (:mod:`specbench.train.data`), feature cache, trainer loop.

The vendored training conversations live under ``specbench/train/data/<set>/`` with a ``SOURCE.md``
each (provenance, licence, how the original was transformed).
"""
