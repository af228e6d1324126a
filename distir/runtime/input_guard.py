"""A run's input guard as one native call: torch's own tensor guard.

`Plan.input_guard` says, for a fully static signature, whether a run's
inputs are accepted exactly as they are (each a tensor of its declared
dtype and shape whose memory is its value); a False sends the run to the
general path (`Plan.check_inputs`), which copies or names the input. Read
in Python, that is seven tensor accessors per input (type, dtype, shape,
layout, negative bit, zero tensor, meta), about 1.5 us a run.

What can change between runs is not only the storage, shape, strides and
version of a tensor: `x.data = y` (and `torch.utils.swap_tensors`) gives
the same Python object another dtype, negative bit or zero-tensor kind
without moving its version counter. So a cached verdict per object, or a
tuple of storage, shape, strides and version, would accept an int32 view
or a negation view in place of the float tensor it replaced: a silently
wrong run. The guard here compares everything instead, in one C++ call:
`torch._C._dynamo.guards.TensorGuards`, the guard torch.compile checks on
each call of a compiled function. It compares, per input, the Python type,
the dispatch key set (which carries the negative and conjugate bits, the
zero-tensor, meta, sparse and other non-dense kinds, and an inference
tensor's missing autograd keys), the dtype, the device, `requires_grad`,
the sizes and the strides against an example of the declared type:
contiguous, dense, not requiring grad. An input it accepts is therefore
one the general check accepts as it is, and also contiguous and not
requiring grad (`InputGuard.contiguous_no_grad`: what the donation and
gradient rules then need not look at). An accepted input in any other
layout (strided, transposed) goes the general path, which accepts it.

The guard is private torch API: at bind time it must accept its example
and refuse a probe of each kind it must refuse, else (or when torch lacks
it) the guard is the accessors in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch


class InputGuard(NamedTuple):
    """A binding's per-run input guard (`Plan.input_guard`)."""

    #: True when the run's inputs are accepted exactly as they are
    accepts: Callable[[Sequence[Any]], bool]
    #: whether an accepted input is also contiguous and does not require grad
    contiguous_no_grad: bool


def native_guard(specs: Sequence[tuple[torch.dtype, torch.Size]]) -> InputGuard | None:
    """The guard of a static signature `specs` ((dtype, size) per input) as
    one native check, or None when torch has no such check that behaves as
    this module relies on."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    count = len(specs)
    try:
        # Its contract, checked on small inputs of the same dtypes and ranks
        # (what it compares does not depend on the sizes).
        small = [(dtype, torch.Size(min(d, 2) for d in size)) for dtype, size in specs]
        if not _behaves(_guards(TensorGuards, small).check, small):
            return None
        check = _guards(TensorGuards, specs).check
    except Exception:  # noqa: BLE001 - a torch without this guard's contract
        return None

    def accepts(inputs: Sequence[Any]) -> bool:
        return len(inputs) == count and check(*inputs)

    return InputGuard(accepts, True)


def _guards(kind: Any, specs: Sequence[tuple[torch.dtype, torch.Size]]) -> Any:
    """A `TensorGuards` for contiguous inputs of `specs`, from one-element
    examples of each dtype and rank (the declared sizes and strides are
    given apart, so nothing large is made)."""
    examples = [torch.empty((1,) * len(size), dtype=dtype) for dtype, size in specs]
    return kind(
        *examples,
        dynamic_dims_sizes=[list(size) for _, size in specs],
        dynamic_dims_strides=[
            list(torch.empty(size, dtype=dtype, device="meta").stride()) for dtype, size in specs
        ],
    )


def _behaves(check: Callable[..., bool], specs: Sequence[tuple[torch.dtype, torch.Size]]) -> bool:
    """Whether `check` accepts contiguous inputs of `specs` and refuses,
    in each position, each kind of input the general check copies or
    refuses, or that is not contiguous or requires grad."""
    plain = [torch.zeros(size, dtype=dtype) for dtype, size in specs]
    if not check(*plain):
        return False
    for i, (dtype, size) in enumerate(specs):
        x = plain[i]
        other = torch.int32 if dtype.is_floating_point or dtype.is_complex else torch.float32
        probes = [
            torch.zeros(size, dtype=other),
            torch._efficientzerotensor(size, dtype=dtype),
            torch.empty(size, dtype=dtype, device="meta"),
            torch.zeros((*size, 1), dtype=dtype),  # another rank
            x.tolist(),
        ]
        if dtype.is_floating_point:
            probes += [x._neg_view(), x.clone().requires_grad_()]
        if x.numel() > 1:
            probes.append(torch.zeros((*size[:-1], size[-1] * 2), dtype=dtype)[..., ::2])
        with torch.inference_mode():
            probes.append(torch.zeros(size, dtype=dtype))
        for probe in probes:
            if probe is not None and check(*plain[:i], probe, *plain[i + 1 :]):
                return False
    return True
