"""Real CKKS ciphertexts through distir: bit-exact with SEAL's own addition,
with the secret key kept by the data owner, outside the group."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tenseal as ts  # the `test` extra installs it: never skipped
import torch

import distir
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
    # What the owner decrypted is the plaintext sum, to the digits printed:
    # within one unit of the sixth decimal (CKKS is approximate, so a value
    # next to a rounding boundary may print one unit apart).
    decrypted = re.findall(r"owner decrypted aggregate\[:4\] = \[(.*)\]", proc.stdout)
    plain = re.findall(r"plaintext sum\[:4\]             = \[(.*)\]", proc.stdout)
    assert len(decrypted) == len(plain) == 2, proc.stdout
    for got, want in zip(decrypted, plain):
        got_values = [float(v) for v in got.split(",")]
        want_values = [float(v) for v in want.split(",")]
        assert len(got_values) == len(want_values) == 4, proc.stdout
        assert all(abs(a - b) <= 1.01e-6 for a, b in zip(got_values, want_values)), proc.stdout
    relative = [float(x) for x in re.findall(r"\(relative ([0-9.e+-]+)\)", proc.stdout)]
    assert len(relative) == 2 and max(relative) < 1e-5, proc.stdout
    assert proc.stdout.count("bit-exact with SEAL: yes") == 2
    assert proc.stdout.count("every rank holds the same limbs: yes") == 2
    assert proc.stdout.count("owner decrypted aggregate") == 2
    assert "secret key on any rank: no" in proc.stdout
    assert "Traceback" not in proc.stderr


def own_ciphertext_and_sums(ctx, public: bytes, size: int) -> dict:
    """Worker: this rank's encrypted update (as limbs) and what distir's two
    lowerings of the example program return for it."""
    from distir.he.seal import ckks_to_limbs

    example = _load_example()
    context = ts.context_from(public)
    encrypted = ts.ckks_vector(context, example.private_update(ctx.rank, size).tolist())
    limbs, moduli = ckks_to_limbs(encrypted)
    sums = {name: distir.compile(PROGRAM, pipeline).run(limbs, moduli)
            for name, pipeline in example.LOWERINGS.items()}  # fmt: skip
    return {"limbs": limbs, "moduli": moduli, "sums": sums}


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_the_example_program_on_three_ranks_equals_seal_and_python_integers():
    """Judged outside the example: every rank's sum equals the per-limb
    modular sum in Python integers (tests/oracle.py) and SEAL's own
    addition of the ranks' ciphertexts, and the owner decrypts the
    plaintext sum."""
    import oracle

    from distir.he.seal import ckks_to_limbs, limbs_to_ckks

    example = _load_example()
    owner = example.make_owner_context()
    size, nproc = 64, 3
    reports = distir.launch(own_ciphertext_and_sums, nproc, example.public_context(owner), size,
                            pass_context=True, timeout=230)  # fmt: skip
    cts = [r["limbs"] for r in reports]
    moduli = reports[0]["moduli"].tolist()
    (want,) = oracle.ciphertext_sum(cts, moduli)[0]
    template = ts.ckks_vector(owner, [0.0] * size)
    seal_sum = limbs_to_ckks(cts[0], template)
    for ct in cts[1:]:
        seal_sum = seal_sum + limbs_to_ckks(ct, template)
    assert want.mismatch(ckks_to_limbs(seal_sum)[0]) is None  # the oracle agrees with SEAL
    plain = sum(example.private_update(r, size) for r in range(nproc))
    for name in example.LOWERINGS:
        for rank, report in enumerate(reports):
            assert want.mismatch(report["sums"][name]) is None, (name, rank)
        decrypted = torch.tensor(limbs_to_ckks(reports[0]["sums"][name], template).decrypt())
        assert (decrypted.double() - plain).abs().max().item() < 1e-6, name
