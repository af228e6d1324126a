"""`concat` and `extract_slice` in the builder: a packed reduction (the
log-sum-exp merge of (max, sum) pairs) written in Python instead of MLIR
text, checked against numpy on simulated ranks; bad slices are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import distir
from distir.ir import builder as b
from distir.ir.builder import BuilderError

N = 4


def _lse_merge(x, y):
    """(m1, s1) + (m2, s2) = (M, s1·e^(m1-M) + s2·e^(m2-M)), M = max(m1, m2)."""
    m1, s1 = b.extract_slice(x, [0], [N]), b.extract_slice(x, [N], [N])
    m2, s2 = b.extract_slice(y, [0], [N]), b.extract_slice(y, [N], [N])
    m = b.arith("maximumf", m1, m2)
    scaled = [b.arith("mulf", s, b.math("exp", b.arith("subf", mi, m))) for s, mi in ((s1, m1), (s2, m2))]
    return b.concat([m, b.arith("addf", *scaled)])


def test_a_packed_log_sum_exp_built_in_python_equals_numpy():
    def body(maxes, sums):
        packed = b.concat([maxes, sums], axis=0)
        return b.all_reduce(packed, combine=_lse_merge)

    t = b.tensor_type("f64", [N])
    program = distir.compile(b.build_program(body, [t, t]))
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(3, N)) for _ in range(3)]  # 3 ranks, 3 values each per column
    inputs = [
        [torch.tensor(v.max(0)), torch.tensor(np.exp(v - v.max(0)).sum(0))] for v in logits
    ]
    results = program.simulate(inputs)
    everything = np.concatenate(logits)
    want = np.log(np.exp(everything).sum(0))
    for r in results:
        m, s = r[:N].numpy(), r[N:].numpy()
        np.testing.assert_allclose(m + np.log(s), want, rtol=1e-12)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: b.extract_slice(x, [2], [3]), r"dimension 0 takes \[2, 5\) of a size 4"),
        (lambda x: b.extract_slice(x, [0, 0], [1, 1]), "needs 1 offsets and sizes, got 2 and 2"),
        (lambda x: b.concat([x, b.constant_tensor(0.0, "f32", [2, 2])]), "other dimensions equal"),
        (lambda x: b.concat([x], axis=1), "axis 1 is out of range"),
        (lambda x: b.concat([]), "at least one value"),
    ],
)
def test_bad_slices_and_concats_are_named_at_the_call(call, message):
    with pytest.raises(BuilderError, match=message) as info:
        b.build_program(lambda x: call(x), [b.tensor_type("f32", [4])])
    assert "test_builder_slices.py" in str(info.value)
