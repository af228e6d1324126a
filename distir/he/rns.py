"""Exact RNS (residue number system) arithmetic on torch tensors.

An RNS-CKKS ciphertext is stored as int64 limbs of shape ``[..., L, N]``:
limb ``l`` lives modulo ``q_l`` (``moduli`` has shape ``[L]``, each
``2 <= q_l < 2**62``), and inputs are *reduced* (``0 <= limb < q_l``).  The
homomorphic sum of two ciphertexts is the per-limb modular sum
``(a + b) mod q_l``, exactly SEAL's ``Evaluator::add``.

Why the branch-free "subtract-and-mask" form is exact
-----------------------------------------------------
For reduced ``a, b`` we have ``s = a + b <= 2q - 2 < 2**63`` because
``q < 2**62``, so the int64 sum never overflows.  Then:

* ``t = s - q`` lies in ``[-q, q - 2]``; it is negative **iff** ``s < q``,
  i.e. exactly when no subtraction was needed;
* an *arithmetic* right shift by 63 copies the sign bit into every bit, so
  ``t >> 63`` is ``-1`` (all ones) when ``t < 0`` and ``0`` otherwise;
* ``(t >> 63) & q`` is therefore ``q`` when ``t < 0`` and ``0`` otherwise,
  and ``t + ((t >> 63) & q)`` equals ``s`` when ``s < q`` and ``s - q``
  otherwise -- i.e. ``s mod q`` -- with no branches, no comparisons that
  allocate a bool mask, and no division.

Done fully in place (``acc.add_(b); acc.sub_(q); torch.bitwise_right_shift(
acc, 63, out=tmp); tmp.bitwise_and_(q); acc.add_(tmp)``) with one cached
scratch tensor, this is the fastest correct form measured on CPU (a little
faster than ``torch.remainder(a + b, q)``, see
``shared/reference/torch-gloo-baselines.md`` section 4).  The
``"remainder"`` implementation (``torch.remainder`` with ``out=``) is kept
as an independent reference and for callers whose inputs may be in a lazy
``[0, 2q)``-style range.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from distir.core.checks import (
    limb_layout_problem,
    moduli_problem,
    unreduced_limb_problem,
)
from distir.ir.modular import MAX_MODULUS_EXCLUSIVE

__all__ = [
    "IMPLEMENTATIONS",
    "MAX_MODULUS_EXCLUSIVE",
    "CiphertextAddCombine",
    "TorchRNSBackend",
    "prepare_ciphertext_add_combine",
    "subtract_and_mask_",
]


def subtract_and_mask_(s: Tensor, q: Tensor, scratch: Tensor) -> Tensor:
    """``s = s mod q`` in place for ``0 <= s < 2q`` (``s`` a sum of two
    reduced limbs), with ``scratch`` a tensor of ``s``'s shape: subtract q,
    then add it back where the difference went negative (the arithmetic
    shift by 63 is all ones exactly there). The one home of this form: the
    RNS backend, the ring's modular combine and `lower-ciphertext-add`'s
    region (as IR) compute the same operations."""
    s.sub_(q)
    torch.bitwise_right_shift(s, 63, out=scratch)
    scratch.bitwise_and_(q)
    return s.add_(scratch)

#: Valid values for ``implementation`` (``None`` picks the backend default).
IMPLEMENTATIONS: tuple[str | None, ...] = (None, "subtract-and-mask", "remainder")

_DEFAULT_IMPLEMENTATION = "subtract-and-mask"
_MAX_CACHED_SCRATCH = 8
_MAX_CACHED_MODULI = 16


class TorchRNSBackend:
    """RNS modular arithmetic on torch int64 tensors (CPU or CUDA).

    The device is taken from the limb tensors; moduli living on another
    device are copied once and cached.  Moduli are validated
    (:meth:`check_moduli`) the first time a given moduli tensor (at a given
    ``_version``) is used, so the hot path performs no host/device sync.
    Limb values are *not* checked on the hot path; call :meth:`check_reduced`
    where inputs are untrusted.

    Scratch tensors are cached per thread, keyed by (shape, device), so
    concurrent use from several threads is safe.
    """

    name = "torch"

    def __init__(self) -> None:
        self._local = threading.local()
        self._moduli_lock = threading.Lock()
        # key: (id(moduli), device) -> (weakref to moduli, version, column [L, 1])
        self._moduli_cache: OrderedDict[tuple[int, torch.device], tuple[Any, int, Tensor]] = (
            OrderedDict()
        )

    def __repr__(self) -> str:
        return "TorchRNSBackend()"

    # ------------------------------------------------------------------ checks
    @staticmethod
    def check_moduli(moduli: Tensor) -> None:
        """Raise ``TypeError``/``ValueError`` unless ``moduli`` is a rank-1 int64
        tensor with every ``2 <= q < 2**62`` (the rule:
        ``distir.core.checks.moduli_problem``), holding at least one."""
        if not isinstance(moduli, Tensor):
            raise TypeError(f"moduli must be a torch.Tensor, got {type(moduli).__name__}")
        problem = moduli_problem(moduli)
        if problem is None and moduli.numel() == 0:
            problem = "moduli must hold at least one modulus (L >= 1), got shape [0]"
        if problem is not None:
            raise ValueError(problem)

    def check_reduced(self, x: Tensor, moduli: Tensor) -> None:
        """Raise ``ValueError`` unless every limb of ``x`` (``[..., L, N]``) is
        in ``[0, q_l)``; the message names the limb index, value and modulus."""
        self._column(moduli, x)  # checks the moduli
        problem = limb_layout_problem(x, moduli) or unreduced_limb_problem(x, moduli)
        if problem is not None:
            raise ValueError(problem)

    # -------------------------------------------------------------- arithmetic
    def add_mod(self, lhs: Tensor, rhs: Tensor, moduli: Tensor) -> Tensor:
        """Return a new tensor ``(lhs + rhs) mod q`` (reduced inputs)."""
        q = self._column(moduli, lhs)
        self._check_pair(lhs, rhs, moduli)
        out = torch.add(lhs, rhs)
        self._subtract_and_mask(out, q)
        return out

    def add_mod_(self, acc: Tensor, other: Tensor, moduli: Tensor) -> Tensor:
        """``acc = (acc + other) mod q`` in place; returns ``acc``.

        Uses the subtract-and-mask form with one cached scratch tensor, so a
        repeated call with the same shape and device allocates nothing."""
        q = self._column(moduli, acc)
        self._check_pair(acc, other, moduli)
        acc.add_(other)
        self._subtract_and_mask(acc, q)
        return acc

    def add_mod_remainder(self, lhs: Tensor, rhs: Tensor, moduli: Tensor) -> Tensor:
        """Out-of-place ``torch.remainder(lhs + rhs, q)`` (reference implementation)."""
        q = self._column(moduli, lhs)
        self._check_pair(lhs, rhs, moduli)
        out = torch.add(lhs, rhs)
        return torch.remainder(out, q, out=out)

    def add_mod_remainder_(self, acc: Tensor, other: Tensor, moduli: Tensor) -> Tensor:
        """In-place ``acc = remainder(acc + other, q)``; returns ``acc``."""
        q = self._column(moduli, acc)
        self._check_pair(acc, other, moduli)
        acc.add_(other)
        torch.remainder(acc, q, out=acc)
        return acc

    def reduce_(self, x: Tensor, moduli: Tensor) -> Tensor:
        """``x = x mod q`` in place (``torch.remainder`` with ``out=``); returns ``x``.

        Meant for non-negative ``x`` (e.g. a deferred sum of several reduced
        operands); ``torch.remainder`` also maps negative values into ``[0, q)``."""
        q = self._column(moduli, x)
        self._check_limb_tensor(x, moduli, "x")
        torch.remainder(x, q, out=x)
        return x

    # ---------------------------------------------------------------- helpers
    def _subtract_and_mask(self, acc: Tensor, q: Tensor) -> None:
        # acc holds s = a + b in [0, 2q - 2]; leave s mod q in acc.
        subtract_and_mask_(acc, q, self._scratch(acc))

    def _scratch(self, like: Tensor) -> Tensor:
        cache: OrderedDict[tuple[tuple[int, ...], torch.device], Tensor] | None
        cache = getattr(self._local, "scratch", None)
        if cache is None:
            cache = OrderedDict()
            self._local.scratch = cache
        key = (tuple(like.shape), like.device)
        tmp = cache.get(key)
        if tmp is None:
            tmp = torch.empty(like.shape, dtype=torch.int64, device=like.device)
            cache[key] = tmp
            if len(cache) > _MAX_CACHED_SCRATCH:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return tmp

    def scratch_cache_size(self) -> int:
        """Number of scratch tensors cached for the calling thread."""
        cache = getattr(self._local, "scratch", None)
        return 0 if cache is None else len(cache)

    def _column(self, moduli: Tensor, like: Tensor) -> Tensor:
        """``moduli`` as an ``[L, 1]`` int64 column on ``like``'s device (cached,
        validated once per moduli tensor and version)."""
        if not isinstance(moduli, Tensor):
            raise TypeError(f"moduli must be a torch.Tensor, got {type(moduli).__name__}")
        if not isinstance(like, Tensor):
            raise TypeError(f"limbs must be a torch.Tensor, got {type(like).__name__}")
        key = (id(moduli), like.device)
        version = moduli._version
        entry = self._moduli_cache.get(key)
        if entry is not None and entry[0]() is moduli and entry[1] == version:
            return entry[2]
        self.check_moduli(moduli)
        column = moduli.to(like.device).view(moduli.shape[0], 1)
        with self._moduli_lock:
            self._moduli_cache[key] = (weakref.ref(moduli), version, column)
            self._moduli_cache.move_to_end(key)
            while len(self._moduli_cache) > _MAX_CACHED_MODULI:
                self._moduli_cache.popitem(last=False)
        return column

    @staticmethod
    def _check_limb_tensor(x: Tensor, moduli: Tensor, what: str) -> None:
        problem = limb_layout_problem(x, moduli, what)
        if problem is not None:
            raise ValueError(problem)

    def _check_pair(self, lhs: Tensor, rhs: Tensor, moduli: Tensor) -> None:
        if not isinstance(rhs, Tensor):
            raise TypeError(f"operand must be a torch.Tensor, got {type(rhs).__name__}")
        self._check_limb_tensor(lhs, moduli, "lhs")
        if rhs.dtype != torch.int64:
            raise ValueError(f"rhs limbs must have dtype torch.int64, got {rhs.dtype}")
        if lhs.shape != rhs.shape:
            raise ValueError(f"ciphertext shapes differ: {tuple(lhs.shape)} vs {tuple(rhs.shape)}")
        if lhs.device != rhs.device:
            raise ValueError(f"ciphertexts are on different devices: {lhs.device} vs {rhs.device}")


@dataclass(frozen=True)
class CiphertextAddCombine:
    """A prepared ciphertext addition: ``combine(lhs, rhs, moduli)`` returns a new
    tensor ``(lhs + rhs) mod q``; ``combine.in_place(acc, other, moduli)`` updates
    and returns ``acc``."""

    backend: TorchRNSBackend = field(repr=False, compare=False)
    backend_name: str
    modulus_basis: str
    implementation: str | None

    def __call__(self, lhs: Tensor, rhs: Tensor, moduli: Tensor) -> Tensor:
        if self.implementation == "remainder":
            return self.backend.add_mod_remainder(lhs, rhs, moduli)
        return self.backend.add_mod(lhs, rhs, moduli)

    def in_place(self, acc: Tensor, other: Tensor, moduli: Tensor) -> Tensor:
        if self.implementation == "remainder":
            return self.backend.add_mod_remainder_(acc, other, moduli)
        return self.backend.add_mod_(acc, other, moduli)

    @property
    def effective_implementation(self) -> str:
        """The implementation actually used (``None`` resolves to the default)."""
        return self.implementation or _DEFAULT_IMPLEMENTATION


def prepare_ciphertext_add_combine(
    backend: TorchRNSBackend | str,
    *,
    modulus_basis: str = "Q",
    implementation: str | None = None,
) -> CiphertextAddCombine:
    """Bind a ciphertext addition to an RNS backend.

    ``backend`` is a :class:`TorchRNSBackend` or the string ``"torch"``;
    ``implementation`` is ``None`` (backend default, subtract-and-mask),
    ``"subtract-and-mask"`` or ``"remainder"``.  ``modulus_basis`` (e.g.
    ``"Q"``) is recorded; the arithmetic is per-limb modulo whatever moduli
    are passed at call time."""
    if isinstance(backend, str):
        if backend != TorchRNSBackend.name:
            raise TypeError(
                f"unknown RNS backend {backend!r}: accepted are a TorchRNSBackend instance "
                f"or the string {TorchRNSBackend.name!r}"
            )
        backend = TorchRNSBackend()
    elif not isinstance(backend, TorchRNSBackend):
        raise TypeError(
            "backend must be a TorchRNSBackend instance or the string 'torch', got "
            f"{type(backend).__name__}"
        )
    if implementation not in IMPLEMENTATIONS:
        valid = ", ".join(repr(i) for i in IMPLEMENTATIONS)
        raise ValueError(
            f"unknown ciphertext-add implementation {implementation!r}; valid: {valid}"
        )
    if not isinstance(modulus_basis, str) or not modulus_basis:
        raise ValueError(f"modulus_basis must be a non-empty string, got {modulus_basis!r}")
    return CiphertextAddCombine(
        backend=backend,
        backend_name=backend.name,
        modulus_basis=modulus_basis,
        implementation=implementation,
    )
