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
`combines.py` (what a combine region becomes) and `transport.exchange` (the
message layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distir.ops.all_reduce.torch.ciphertext import (
    CiphertextAllReduceImplementation,
    CombineCiphertextAddImplementation,
    ExactCiphertextAddImplementation,
)
from distir.ops.all_reduce.torch.gather_fold import GatherFoldAllReduceImplementation
from distir.ops.all_reduce.torch.halving_doubling import HalvingDoublingAllReduceImplementation
from distir.ops.all_reduce.torch.native import NativeAllReduceImplementation
from distir.ops.all_reduce.torch.recursive_doubling import (
    RecursiveDoublingAllReduceImplementation,
)
from distir.ops.all_reduce.torch.ring import RingAllReduceImplementation
from distir.transport.registry import Implementation

__all__ = [
    "CombineCiphertextAddImplementation",
    "ExactCiphertextAddImplementation",
    "GatherFoldAllReduceImplementation",
    "NativeAllReduceImplementation",
    "algorithm_contributions",
    "implementations",
]


def algorithm_contributions() -> list[Implementation]:
    """The algorithms, named alternatives to the defaults, in contribution order."""
    return [
        RingAllReduceImplementation(),
        HalvingDoublingAllReduceImplementation(),
        RecursiveDoublingAllReduceImplementation(),
        CiphertextAllReduceImplementation(),
    ]


def implementations(options: Mapping[str, Any]) -> list[Implementation]:
    """The all-reduces' implementations, in priority order: the defaults,
    the prepared ciphertext add when `options["ciphertext_add"]` holds one
    (an RNS add combine, `distir.he.rns.prepare_ciphertext_add_combine`),
    then the algorithms.

    The registry takes a requested name first (the op's `algorithm`, or the
    runtime's default choice for a generic all-reduce), else the highest
    priority, and on a tie the earliest contribution: ciphertext-auto has
    priority 1, so it replaces exact-modular-sum (0) by default, while a
    prepared `ciphertext_add` (rns-combine, also 1, contributed earlier)
    still wins."""
    contributions: list[Implementation] = [
        NativeAllReduceImplementation(),
        GatherFoldAllReduceImplementation(),
        ExactCiphertextAddImplementation(),
    ]
    ciphertext_add = options.get("ciphertext_add")
    if ciphertext_add is not None:
        contributions.append(CombineCiphertextAddImplementation(ciphertext_add))
    return contributions + algorithm_contributions()
