"""Real CKKS ciphertexts through distir: bit-exact with SEAL's own addition,
with the secret key kept by the data owner, outside the group."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import distir

ts = pytest.importorskip("tenseal")
from distir.he.seal import _bytes_fields, ckks_to_limbs, limbs_to_ckks  # noqa: E402

ROOT = Path(__file__).parents[2]
PROGRAM = ROOT / "examples" / "secure_aggregation.mlir"


def _load_example():
    spec = importlib.util.spec_from_file_location(
        "secure_aggregation_example", ROOT / "examples" / "secure_aggregation.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Launched(Exception):
    pass


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


def test_the_ranks_get_only_public_material_and_the_owner_keeps_the_secret_key(monkeypatch):
    example = _load_example()
    sent: list = []

    def fake_launch(fn, nproc, *args, **kwargs):
        sent.extend(args)
        raise _Launched

    monkeypatch.setattr(example, "launch", fake_launch)
    monkeypatch.setattr(sys, "argv", ["secure_aggregation.py", "--nproc", "2"])
    with pytest.raises(_Launched):
        example.main()
    # Everything a rank process receives: the public context and the size.
    assert [type(a) for a in sent] == [bytes, int]
    public = sent[0]
    assert _bytes_fields(public, 3) == []  # no private part in the serialization
    loaded = ts.context_from(public)
    assert not loaded.is_private() and not loaded.has_secret_key()
    assert loaded.has_public_key() and not loaded.has_relin_keys()
    # It encrypts, and only the owner's secret key decrypts what it made.
    owner = example.make_owner_context()
    assert owner.is_private()
    mine = ts.context_from(example.public_context(owner))
    vector = ts.ckks_vector(mine, [1.5, -2.25])
    with pytest.raises(ValueError):
        vector.decrypt()
    decrypted = ts.ckks_vector_from(owner, vector.serialize()).decrypt()
    assert max(abs(a - b) for a, b in zip(decrypted, [1.5, -2.25])) < 1e-5


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
    assert proc.stdout.count("every rank holds the same limbs: yes") == 2
    assert proc.stdout.count("owner decrypted aggregate") == 2
    assert "secret key on any rank: no" in proc.stdout
    assert "Traceback" not in proc.stderr
