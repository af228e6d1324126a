"""The Torch implementations of `dist.all_reduce` (and of the ciphertext
sum, an all-reduce whose combine is the modular add), in one package.

gloo's native all-reduce only knows sum, prod, min, max and the bitwise
kinds; a generic all-reduce (a combine region) and the ciphertext sum need
their own algorithms. The defaults, one per form of the op:

* `native` (`native.py`): a native kind, as the backend's own collective;
* `gather-fold` (`gather_fold.py`): a combine region, gathered and folded
  in rank order (any associative combine; P copies of the message);
* `exact-modular-sum` (`ciphertext.py`): the ciphertext sum, exactly.

The algorithms, built from point-to-point messages, are implementations
selected by name (the op's `algorithm` property, its default for the group
size, `AllReduceOp.default_algorithm`, or `compile(..., implementations=...)`),
or, for the ciphertext op, by priority (`algorithm_contributions`):

* `ring` (`ring.py`): commutative elementwise combines and native kinds;
* `halving-doubling` (`halving_doubling.py`): elementwise, rank order kept;
* `recursive-doubling` (`recursive_doubling.py`): any combine, rank order
  kept, whole tensors;
* `ciphertext-auto` (`ciphertext.py`): the ciphertext sum, by default;
  `rns-combine` when an RNS backend prepared its add.

They share `base.py` (layout helpers, the flat-tensor plumbing),
`combines.py` (what a combine region becomes) and `backends.exchange` (the
message layer).
"""

from __future__ import annotations

from distir.backends.all_reduce.ciphertext import (
    CiphertextAllReduceImplementation,
    CombineCiphertextAddImplementation,
    ExactCiphertextAddImplementation,
)
from distir.backends.all_reduce.gather_fold import GatherFoldAllReduceImplementation
from distir.backends.all_reduce.halving_doubling import HalvingDoublingAllReduceImplementation
from distir.backends.all_reduce.native import NativeAllReduceImplementation
from distir.backends.all_reduce.recursive_doubling import (
    RecursiveDoublingAllReduceImplementation,
)
from distir.backends.all_reduce.ring import RingAllReduceImplementation
from distir.backends.registry import Implementation

__all__ = [
    "CombineCiphertextAddImplementation",
    "ExactCiphertextAddImplementation",
    "GatherFoldAllReduceImplementation",
    "NativeAllReduceImplementation",
    "algorithm_contributions",
]


def algorithm_contributions() -> list[Implementation]:
    """The algorithms, named alternatives to the defaults, in contribution order."""
    return [
        RingAllReduceImplementation(),
        HalvingDoublingAllReduceImplementation(),
        RecursiveDoublingAllReduceImplementation(),
        CiphertextAllReduceImplementation(),
    ]
