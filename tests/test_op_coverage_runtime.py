"""Every op of the dist dialect has its run-time meaning: reference
semantics the simulator runs and a default Torch implementation (or, for a
local check, a kernel), found from the op's type by a registry.

Together with tests/ir/test_op_coverage.py (syntax, verifier cases, builder
helper), a new op that lacks any of these fails here.
"""

from __future__ import annotations

import pytest
from xdsl.irdl import IRDLOperation

from distir.core.semantics import LOCAL_CHECK_KERNELS
from distir.ir.dialect import GroupOp, MeshOp, WaveOp, YieldOp, dist_ops
from distir.transport.implementations import distributed_operation_contributions

#: ops that only declare (groups, meshes), terminate, or gather other ops
STRUCTURAL = (GroupOp, MeshOp, YieldOp, WaveOp)

IMPLEMENTATIONS = distributed_operation_contributions()


def _executable() -> list[type[IRDLOperation]]:
    return [op for op in dist_ops() if op not in STRUCTURAL and op not in LOCAL_CHECK_KERNELS]


@pytest.mark.parametrize("op", _executable(), ids=lambda op: op.name)
def test_op_has_reference_semantics(op: type[IRDLOperation]) -> None:
    from distir.core.semantics import semantics_of

    assert semantics_of(op) is not None, f"{op.name} has no semantics record"


@pytest.mark.parametrize("op", _executable(), ids=lambda op: op.name)
def test_op_has_a_default_torch_implementation(op: type[IRDLOperation]) -> None:
    assert any(issubclass(op, impl.operation_types) for impl in IMPLEMENTATIONS), (
        f"no implementation in distributed_operation_contributions() executes {op.name}"
    )


def test_local_checks_are_kernels_and_every_op_is_classified() -> None:
    local = [op for op in dist_ops() if op in LOCAL_CHECK_KERNELS]
    assert [op.name for op in local] == ["dist.assert_reduced"]
    classified = set(_executable()) | set(local) | set(STRUCTURAL)
    assert classified == set(dist_ops())
