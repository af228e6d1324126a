"""All-reduce algorithms built from point-to-point messages, one module each.

gloo's native all-reduce only knows sum, prod, min, max and the bitwise
kinds; a generic all-reduce (a combine region) and the ciphertext sum need
their own algorithms. Each is an implementation selected by name (the op's
`algorithm` property, the runtime's default choice from
`ir.analysis.choose_algorithm`, or `compile(..., implementations=...)`), or,
for the ciphertext op, by priority:

* `ring` (`ring.py`): commutative elementwise combines and native kinds;
* `halving-doubling` (`halving_doubling.py`): elementwise, rank order kept;
* `recursive-doubling` (`recursive_doubling.py`): any combine, rank order
  kept, whole tensors;
* `ciphertext-auto` (`ciphertext.py`): the ciphertext sum, by default.

They share `base.py` (layout helpers, the flat-tensor plumbing),
`backends.combines` (what a combine region becomes) and
`backends.exchange` (the message layer).
"""

from __future__ import annotations

from distir.backends.registry import Implementation


def algorithm_contributions() -> list[Implementation]:
    """This package's implementations, in contribution order."""
    from distir.backends.algorithms.ciphertext import CiphertextAllReduceImplementation
    from distir.backends.algorithms.halving_doubling import (
        HalvingDoublingAllReduceImplementation,
    )
    from distir.backends.algorithms.recursive_doubling import (
        RecursiveDoublingAllReduceImplementation,
    )
    from distir.backends.algorithms.ring import RingAllReduceImplementation

    return [
        RingAllReduceImplementation(),
        HalvingDoublingAllReduceImplementation(),
        RecursiveDoublingAllReduceImplementation(),
        CiphertextAllReduceImplementation(),
    ]
