"""The root-sensitivity probe of a block drafter's training card.

A block drafter's depth-1 draft is the token after its root, the one token of the committed text it
sees only through its block (its context rows are the target's states strictly before the root).
The block families' held-out evaluation (:mod:`drafters.block.train`) scores depth 1 twice over the
same fixed anchors: with the true roots (``acc_0``) and with the roots shuffled across the anchors
of each batch (``shuffled_root_acc_0``), and counts how often the depth-1 argmax stays the same
(``shuffled_root_same_argmax_0``).

A head that uses its root loses most of its depth-1 accuracy with a wrong root: what survives is
what the context and the token prior predict without it (frequent tokens such as "\\n" or " the",
and anchors whose shuffled root happens to equal the true one). We flag a head that keeps more than
three quarters of it (relative drop below :data:`MIN_RELATIVE_DROP`). Calibration: the fitted test
case whose labels depend on the root alone drops by more than 80%; a head that never sees its root
drops by exactly 0; the DFlash head that shipped before every-anchor training (issue 10) went from
0.108 to 0.090, a 17% drop with 76% of its argmaxes unchanged, and predicted mostly "\\n", "0",
" the", " a": the case the flag is for. A relative threshold rather than an absolute one, because
the accuracies of a starved and a well-trained head differ by a factor of five.
"""

from __future__ import annotations

MIN_RELATIVE_DROP = 0.25


def root_probe(heldout: dict[str, float]) -> dict | None:
    """The probe's figures and flag from held-out metrics, or None when they hold no probe."""
    if "shuffled_root_acc_0" not in heldout or "acc_0" not in heldout:
        return None
    true, shuffled = float(heldout["acc_0"]), float(heldout["shuffled_root_acc_0"])
    drop = true - shuffled
    relative = drop / true if true > 0 else 0.0
    return {
        "acc_true_roots": true,
        "acc_shuffled_roots": shuffled,
        "drop": drop,
        "relative_drop": relative,
        "same_argmax": heldout.get("shuffled_root_same_argmax_0"),
        "min_relative_drop": MIN_RELATIVE_DROP,
        "ignores_root": relative < MIN_RELATIVE_DROP,
    }


def card_lines(probe: dict) -> list[str]:
    """The TRAINING.md section of a probe."""
    same = probe.get("same_argmax")
    lines = [
        "## Root sensitivity",
        "",
        "Held-out depth-1 top-1 agreement on the same anchors with the true roots and with the roots shuffled "
        "across anchors (a head that uses its root loses most of it).",
        "",
        "| roots | depth-1 top-1 |",
        "|---|---:|",
        f"| true | {probe['acc_true_roots']:.3f} |",
        f"| shuffled | {probe['acc_shuffled_roots']:.3f} |",
        "",
        f"Drop {probe['drop']:.3f} ({probe['relative_drop']:.1%} of the true-root accuracy)"
        + (f"; {same:.0%} of the depth-1 argmaxes unchanged by the shuffle." if same is not None else "."),
        "",
    ]
    if probe["ignores_root"]:
        lines.append(f"**Flag: head ignores its root** (relative drop below {probe['min_relative_drop']:.0%}).")
    else:
        lines.append(f"The head uses its root (relative drop at least {probe['min_relative_drop']:.0%}).")
    return lines


__all__ = ["MIN_RELATIVE_DROP", "root_probe", "card_lines"]
