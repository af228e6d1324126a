"""An independent reference of the threshold formulas, in plain Python integers.

It shares no code with `distir.he.threshold` or `distir.he.ntt`: the draws
follow the documented SHAKE-256 streams, the NTT is a recursive evaluation
at the odd powers of the minimal primitive 2N-th root (not SEAL's iterative
butterflies), and every product is an exact Python integer product.
"""

from __future__ import annotations

import hashlib

LABEL = b"distir/threshold/v1/"


def stream(label: str, seed: bytes, nbytes: int) -> bytes:
    return hashlib.shake_256(LABEL + label.encode() + b"\0" + seed).digest(nbytes)


def _words(label: str, seed: bytes, width: int, accept, count: int) -> list[int]:
    nbytes = 64 * width
    while True:
        raw = stream(label, seed, nbytes)
        words = [int.from_bytes(raw[i : i + width], "little") for i in range(0, nbytes, width)]
        kept = [w for w in words if accept(w)]
        if len(kept) >= count:
            return kept[:count]
        nbytes *= 2


def uniform_mod(label: str, seed: bytes, q: int, n: int) -> list[int]:
    limit = (1 << 64) // q * q
    return [w % q for w in _words(label, seed, 8, lambda w: w < limit, n)]


def ternary(seed: bytes, n: int) -> list[int]:
    return [b % 3 - 1 for b in _words("secret", seed, 1, lambda b: b < 255, n)]


def centered_binomial(seed: bytes, n: int) -> list[int]:
    raw = stream("key-noise", seed, 6 * n)
    out = []
    for k in range(n):
        x = list(raw[6 * k : 6 * k + 6])
        x[2] &= 0x1F
        x[5] &= 0x1F
        out.append(sum(bin(v).count("1") for v in x[:3]) - sum(bin(v).count("1") for v in x[3:]))
    return out


def uniform_signed(seed: bytes, bits: int, n: int) -> list[int]:
    width = (bits + 8) // 8
    raw = stream("smudging", seed, width * n)
    mask = (1 << (bits + 1)) - 1
    return [
        (int.from_bytes(raw[k * width : (k + 1) * width], "little") & mask) - (1 << bits)
        for k in range(n)
    ]


def minimal_root(q: int, n: int) -> int:
    """The smallest primitive 2n-th root of unity modulo q."""
    x = 2
    while True:
        g = pow(x, (q - 1) // (2 * n), q)
        if pow(g, n, q) == q - 1:
            break
        x += 1
    return min(pow(g, k, q) for k in range(1, 2 * n, 2))


def _evaluate_at_odd_powers(p: list[int], psi: int, q: int) -> list[int]:
    """[p(psi^(2k+1)) for k < n] for psi a primitive 2n-th root, n = len(p)."""
    n = len(p)
    if n == 1:
        return [p[0] % q]
    psi2 = psi * psi % q
    even = _evaluate_at_odd_powers(p[0::2], psi2, q)
    odd = _evaluate_at_odd_powers(p[1::2], psi2, q)
    out = []
    x = psi  # psi^(2k+1)
    step = psi2
    for k in range(n):
        j = k % (n // 2)
        out.append((even[j] + x * odd[j]) % q)
        x = x * step % q
    return out


def bit_reverse(i: int, bits: int) -> int:
    return int(format(i, f"0{bits}b")[::-1], 2)


def ntt(p: list[int], q: int) -> list[int]:
    """SEAL's NTT form: index i holds p(psi^(2*bit_reverse(i)+1))."""
    n = len(p)
    values = _evaluate_at_odd_powers([c % q for c in p], minimal_root(q, n), q)
    bits = n.bit_length() - 1
    return [values[bit_reverse(i, bits)] for i in range(n)]


def ntt_limbs(p: list[int], moduli: list[int]) -> list[list[int]]:
    return [ntt(p, q) for q in moduli]


def crp_like(label: str, seed: bytes, moduli: list[int], n: int) -> list[list[int]]:
    return [uniform_mod(f"{label}/{i}", seed, q, n) for i, q in enumerate(moduli)]


def crp(seed: bytes, moduli: list[int], n: int) -> list[list[int]]:
    return crp_like("crp", seed, moduli, n)


def secret(seed: bytes, moduli: list[int], n: int) -> list[list[int]]:
    return ntt_limbs(ternary(seed, n), moduli)


def key_share(s, a, noise_seed: bytes, moduli: list[int], n: int) -> list[list[int]]:
    """h = e - a*s per limb and coefficient."""
    e = ntt_limbs(centered_binomial(noise_seed, n), moduli)
    return [[(e[j][k] - a[j][k] * s[j][k]) % q for k in range(n)] for j, q in enumerate(moduli)]


def modular_sum(polys, moduli: list[int]) -> list[list[int]]:
    return [
        [sum(p[j][k] for p in polys) % q for k in range(len(polys[0][0]))]
        for j, q in enumerate(moduli)
    ]


def lagrange(points: list[int], j: int, q: int) -> int:
    """The Lagrange coefficient at 0 of point j (points are x = party + 1)."""
    num = den = 1
    for k in points:
        if k != j:
            num *= k + 1
            den *= k - j
    return num * pow(den, -1, q) % q


def shamir_share(s, coefficients, party: int, moduli: list[int]):
    """f(x) = s + c_1 x + ... at x = party + 1, per limb and coefficient."""
    x = party + 1
    return [
        [
            (s[j][k] + sum(c[j][k] * x ** (i + 1) for i, c in enumerate(coefficients))) % q
            for k in range(len(s[0]))
        ]
        for j, q in enumerate(moduli)
    ]


def decryption_share(c1, sk, active, party, smudging_seed, bits, moduli, n):
    """d = c1*lambda*sk + e' per limb and coefficient (moduli: the ciphertext's)."""
    e = ntt_limbs(uniform_signed(smudging_seed, bits, n), moduli)
    out = []
    for j, q in enumerate(moduli):
        weight = lagrange(active, party, q)
        out.append([(c1[j][k] * weight * sk[j][k] + e[j][k]) % q for k in range(n)])
    return out
