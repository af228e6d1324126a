"""Real CKKS ciphertexts through distir: bit-exact with SEAL's own addition."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distir

ts = pytest.importorskip("tenseal")
from distir.he.seal import ckks_to_limbs, limbs_to_ckks  # noqa: E402

ROOT = Path(__file__).parents[2]
PROGRAM = ROOT / "examples" / "secure_aggregation.mlir"


@pytest.mark.parametrize(
    "pipeline",
    ["", "lower-ciphertext-add", "defer-modular-reduction{max-group-size=8}"],
)
def test_distir_sum_of_ckks_ciphertexts_is_bit_exact_with_seal(pipeline):
    context = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
    context.global_scale = 2.0**40
    values = [[float(r), -0.5 * r, 3.25 + r] for r in range(3)]
    vectors = [ts.ckks_vector(context, v) for v in values]
    limbs = [ckks_to_limbs(v) for v in vectors]
    moduli = limbs[0][1]
    results = distir.simulate(distir.compile(PROGRAM, pipeline), [[ct, moduli] for ct, _ in limbs])
    seal_sum = vectors[0] + vectors[1] + vectors[2]
    expected = ckks_to_limbs(seal_sum)[0]
    for result in results:
        assert torch.equal(result, expected)
    decrypted = limbs_to_ckks(results[0], vectors[0]).decrypt()
    for got, want in zip(decrypted, [sum(col) for col in zip(*values)]):
        assert abs(got - want) < 1e-5


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_the_secure_aggregation_example_runs_and_reports_bit_exactness():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "secure_aggregation.py"), "--nproc", "2",
         "--size", "64"],
        capture_output=True, text=True, timeout=230, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("bit-exact with SEAL: yes") == 2
    assert "Traceback" not in proc.stderr
