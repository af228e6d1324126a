"""The default Torch implementations of every dist op, derived from the op
table (`distir.ops.table`): each running family's `torch` module contributes
its `implementations(options)`. An execution owner builds an
`ImplementationRegistry` from `distributed_operation_contributions()`.

The family modules are imported by name from the table (declared edges of
the import graph, as the pass table's), so the table stays torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

import torch

from distir.ops.table import running_families
from distir.transport.registry import Implementation


def distributed_operation_contributions(
    *, ciphertext_add: Callable[..., torch.Tensor] | None = None
) -> list[Implementation]:
    """The implementations an execution owner registers, in priority order
    (family by family; the order among one op's implementations is its
    family's).

    `ciphertext_add`, a prepared RNS add combine (see
    `distir.he.rns.prepare_ciphertext_add_combine`), contributes a
    specialised ciphertext implementation; without it the automatic
    ciphertext sum is used.
    """
    options = {"ciphertext_add": ciphertext_add}
    return [
        implementation
        for family in running_families()
        for implementation in import_module(family.torch_module).implementations(options)
    ]
