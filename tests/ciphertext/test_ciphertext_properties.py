"""The ciphertext all-reduce and its lowerings agree with Python integers, exactly.

For random moduli (2, primes near 2^62, moduli at the headroom boundary of
the deferred reduction and one past it), random shapes and P in 1..8, the
simulator's results of the original program, of the generic lowering and of
the deferred lowering equal `sum % q` computed with Python integers; a sample
runs on real gloo ranks. Bad limbs and moduli are errors in every form of the
program, never a silently wrong sum.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

import distir
from distir.errors import CompileError, DistirError
from distir.runtime.launch import launch

INT64_MAX = (1 << 63) - 1
PRIMES_NEAR_2_62 = [4611686018427387847, 4611686018427387817, 4611686018427387787]


def boundary_modulus(p: int) -> int:
    """The largest q with P·(q − 1) ≤ 2^63 − 1 (deferred reduction exact)."""
    return INT64_MAX // p + 1


def program_text(shape: tuple[int, ...], moduli: list[int]) -> str:
    t = "tensor<" + "x".join(map(str, shape)) + "xi64>"
    q = f"tensor<{len(moduli)}xi64>"
    return f"""
func.func @main(%ct: {t}) -> {t} {{
  %q = arith.constant dense<{moduli}> : {q}
  %y = dist.all_reduce_add_ciphertext %ct, %q : {t}, {q}
  func.return %y : {t}
}}
"""


PIPELINES = {
    "original": "",
    "generic": "lower-ciphertext-add",
    # max-group-size is filled in with P; where the bound fails the op stays
    # and lower-ciphertext-add takes it.
    "deferred": "defer-modular-reduction{{max-group-size={p}}},lower-ciphertext-add",
}


def reference(ciphertexts: list[torch.Tensor], moduli: list[int]) -> torch.Tensor:
    """Σ_r ct_r mod q_l with Python integers, limb by limb."""
    shape = ciphertexts[0].shape
    flat = [c.reshape(-1, shape[-2], shape[-1]).tolist() for c in ciphertexts]
    out = []
    for b in range(len(flat[0])):
        rows = []
        for limb, q in enumerate(moduli):
            rows.append(
                [sum(f[b][limb][k] for f in flat) % q for k in range(shape[-1])]
            )
        out.append(rows)
    return torch.tensor(out, dtype=torch.int64).reshape(shape)


@st.composite
def cases(draw, max_p: int = 8):
    p = draw(st.integers(1, max_p))
    limbs = draw(st.integers(1, 3))
    n = draw(st.integers(1, 5))
    lead = draw(st.sampled_from([(), (2,), (1, 2)]))
    shape = (*lead, limbs, n)
    special = [2, 3, *PRIMES_NEAR_2_62, boundary_modulus(max(p, 3)),
               boundary_modulus(max(p, 3)) + 1, (1 << 62) - 1]
    moduli = [
        draw(st.one_of(st.sampled_from(special), st.integers(2, (1 << 62) - 1)))
        for _ in range(limbs)
    ]
    seed = draw(st.integers(0, 2**16))
    return p, shape, moduli, seed


def rank_inputs(p: int, shape, moduli, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.tensor(moduli, dtype=torch.int64).view(-1, 1)
    out = []
    for _ in range(p):
        raw = torch.randint(0, 1 << 62, shape, generator=gen)
        limbs = torch.remainder(raw, q)
        # Bias towards the extremes: q - 1 stresses every overflow path.
        extreme = torch.randint(0, 3, shape, generator=gen) == 0
        out.append(torch.where(extreme, (q - 1).expand(shape), limbs))
    return out


def deferral_is_exact(p: int, moduli: list[int]) -> bool:
    return p * (max(moduli) - 1) <= INT64_MAX


@settings(max_examples=examples(0.4), deadline=None)
@given(case=cases())
def test_every_lowering_equals_the_python_integer_sum(case):
    p, shape, moduli, seed = case
    inputs = rank_inputs(p, shape, moduli, seed)
    expected = reference(inputs, moduli)
    text = program_text(shape, moduli)
    for name, pipeline in PIPELINES.items():
        program = distir.compile(text, pipeline.format(p=p))
        lowered = str(program.module)
        if name == "deferred":
            # Deferred exactly when the headroom bound holds: at the boundary, not one past.
            assert ("dist.all_reduce sum" in lowered) == deferral_is_exact(p, moduli), moduli
        if name != "original":
            assert "dist.all_reduce_add_ciphertext" not in lowered
        results = program.simulate([[x] for x in inputs], timeout=20)
        for rank, result in enumerate(results):
            assert torch.equal(result, expected), (name, rank, moduli)


def test_the_boundary_is_exact_and_one_past_is_refused():
    p = 5
    q = boundary_modulus(p)
    for moduli, deferred in (([q], True), ([q + 1], False)):
        program = distir.compile(program_text((1, 2), moduli),
                                 f"defer-modular-reduction{{max-group-size={p}}},lower-ciphertext-add")
        assert ("dist.all_reduce sum" in str(program.module)) == deferred
        inputs = [torch.tensor([[moduli[0] - 1, moduli[0] - 2]]) for _ in range(p)]
        results = program.simulate([[x] for x in inputs])
        assert torch.equal(results[0], reference(inputs, moduli))


BAD_INPUTS = {
    "limb equal to q": (lambda q: torch.tensor([[q, 0]]), r"is not reduced modulo q\[0\]"),
    "negative limb": (lambda q: torch.tensor([[0, -1]]), r"is not reduced modulo q\[0\]"),
}


@pytest.mark.parametrize("pipeline", list(PIPELINES))
@pytest.mark.parametrize("bad", list(BAD_INPUTS))
def test_unreduced_limbs_are_rejected_in_every_form(pipeline, bad):
    q = 1000003
    make, message = BAD_INPUTS[bad]
    program = distir.compile(program_text((1, 2), [q]), PIPELINES[pipeline].format(p=2))
    good = torch.tensor([[1, 2]])
    with pytest.raises(DistirError, match=message):
        program.simulate([[good], [make(q)]], timeout=10)


@pytest.mark.parametrize("pipeline", ["", "lower-ciphertext-add"])
def test_moduli_below_2_are_rejected(pipeline):
    text = """
func.func @main(%ct: tensor<1x2xi64>, %q: tensor<1xi64>) -> tensor<1x2xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<1x2xi64>, tensor<1xi64>
  func.return %y : tensor<1x2xi64>
}
"""
    program = distir.compile(text, pipeline)
    inputs = [torch.tensor([[0, 0]]), torch.tensor([1])]
    with pytest.raises(DistirError, match=r"modulus q\[0\] = 1 is outside \[2, 2\^62\)"):
        program.simulate([inputs, inputs], timeout=10)


def test_mismatched_limb_count_is_a_compile_error():
    text = program_text((2, 4), [97, 101, 103])  # 3 moduli, limbs on dim -2 of size 2
    with pytest.raises(CompileError, match="has 3 moduli for 2 limbs"):
        distir.compile(text)


def test_moduli_above_the_declared_bound_are_rejected_after_deferral():
    text = """
func.func @main(%ct: tensor<1x2xi64>, %q: tensor<1xi64>) -> tensor<1x2xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 20 : tensor<1x2xi64>, tensor<1xi64>
  func.return %y : tensor<1x2xi64>
}
"""
    program = distir.compile(text, "defer-modular-reduction{max-group-size=4}")
    inputs = [torch.tensor([[0, 1]]), torch.tensor([1 << 21])]
    with pytest.raises(DistirError, match=r"is not below 2\^20"):
        program.simulate([inputs, inputs], timeout=10)


def test_a_deferred_sum_refuses_a_larger_group_than_it_was_proved_for():
    program = distir.compile(program_text((1, 2), [97]), "defer-modular-reduction{max-group-size=2}")
    inputs = [[torch.tensor([[1, 2]])] for _ in range(3)]
    with pytest.raises(DistirError, match="proved exact for groups of at most 2 ranks"):
        program.simulate(inputs, timeout=10)


def gloo_worker(ctx, cases: list) -> list[torch.Tensor]:
    out = []
    for p, shape, moduli, seed, pipeline in cases:
        inputs = rank_inputs(p, shape, moduli, seed)
        out.append(distir.compile(program_text(shape, moduli), pipeline).run(inputs[ctx.rank]))
    return out


@pytest.mark.multirank
@pytest.mark.timeout(180)
def test_a_sample_on_real_gloo_ranks():
    p = 3
    sample = []
    for i, moduli in enumerate([[2, 3], PRIMES_NEAR_2_62[:2], [boundary_modulus(p)],
                                [boundary_modulus(p) + 1], [(1 << 61) - 1, 97, 5]]):
        shape = (2, len(moduli), 7)
        for pipeline in PIPELINES.values():
            sample.append((p, shape, moduli, 100 + i, pipeline.format(p=p)))
    results = launch(gloo_worker, p, sample, pass_context=True, timeout=170)
    for index, (_, shape, moduli, seed, pipeline) in enumerate(sample):
        expected = reference(rank_inputs(p, shape, moduli, seed), moduli)
        for rank in range(p):
            assert torch.equal(results[rank][index], expected), (pipeline, moduli, rank)
