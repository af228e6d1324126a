"""Raw RNS limbs in and out of TenSEAL (Microsoft SEAL) CKKS ciphertexts.

TenSEAL exposes no array view of a ciphertext's polynomials, so limbs are
read from, and written back into, its serialization:

``CKKSVector.serialize()``
    a protobuf ``CKKSVectorProto``: field 1 ``sizes`` (packed uint32, the
    number of used slots), field 2 ``ciphertexts`` (bytes, one per SEAL
    ciphertext; a CKKSVector has exactly one), field 3 ``scale`` (double).
Each ``ciphertexts`` entry is SEAL's ``Ciphertext::save`` output
    a 16-byte SEAL header ``<HBBBBHQ``: magic ``0xA15E``, header size
    ``0x10``, SEAL major/minor version, ``compr_mode`` (0 none, 1 zlib,
    2 zstd -- TenSEAL's default), 2 reserved bytes, total size in bytes
    (header included) -- followed by the (compressed) payload.
The decompressed payload (``Ciphertext::save_members``)
    ``parms_id`` (4 x uint64), ``is_ntt_form`` (1 byte), ``size``,
    ``poly_modulus_degree`` N, ``coeff_modulus_size`` L (uint64 each),
    ``scale`` (double), ``correction_factor`` (uint64, SEAL >= 4.0), then the
    data as a ``DynArray<uint64>`` saved with its own 16-byte SEAL header
    (compr_mode none), a uint64 element count ``size*L*N`` and the
    coefficients.  The data are the *last* ``size*L*N`` words of the
    payload, laid out ``[poly][limb][coefficient]`` (``data(poly)[l*N + k]``),
    in NTT form for CKKS.

The moduli of a ciphertext are those of its ``parms_id``:
``context.seal_context().data.get_context_data(parms_id).parms().coeff_modulus()``
(a fresh ciphertext is at the first data level: all key-level primes but
the last, "special" one).

Writing back patches the coefficients into the decompressed payload and
re-serializes it uncompressed (``compr_mode`` 0, header size fields fixed
up); SEAL accepts that on load and validates that every limb is below its
modulus.  TenSEAL and zstandard are imported lazily (``pip install
'distir[he]'``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from distir.he.rns import TorchRNSBackend

__all__ = [
    "SealCiphertextLayout",
    "ckks_moduli",
    "ckks_to_limbs",
    "limbs_to_ckks",
    "parse_ckks_vector",
]

_SEAL_MAGIC = 0xA15E
_SEAL_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, major, minor, compr, reserved, size
_COMPR_NONE, _COMPR_ZLIB, _COMPR_ZSTD = 0, 1, 2
_META = struct.Struct("<4QBQQQd")  # parms_id, is_ntt_form, size, N, L, scale

_INSTALL_HINT = "install distir[he] (pip install 'distir[he]': tenseal and zstandard)"


def _import_tenseal() -> Any:
    try:
        import tenseal as ts
        import tenseal.sealapi  # noqa: F401  (registers seal::Modulus for context queries)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(f"TenSEAL interop needs the 'tenseal' package: {_INSTALL_HINT}") from exc
    return ts


def _zstd_decompress(data: bytes) -> bytes:
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"this SEAL ciphertext is zstd-compressed; reading it needs 'zstandard': "
            f"{_INSTALL_HINT}"
        ) from exc
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


# --------------------------------------------------------------------- protobuf
def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated protobuf varint in TenSEAL serialization")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _proto_fields(buf: bytes) -> list[tuple[int, int, int, int, int]]:
    """Split a protobuf message into ``(field, wire_type, start, value_start, end)``."""
    fields = []
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos)
            value_start = start
        elif wire == 1:
            value_start, pos = pos, pos + 8
        elif wire == 2:
            length, value_start = _read_varint(buf, pos)
            pos = value_start + length
        elif wire == 5:
            value_start, pos = pos, pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} in TenSEAL serialization")
        if pos > len(buf):
            raise ValueError("truncated protobuf field in TenSEAL serialization")
        fields.append((number, wire, start, value_start, pos))
    return fields


# ---------------------------------------------------------------- SEAL format
@dataclass(frozen=True)
class SealCiphertextLayout:
    """Where things are in one serialized TenSEAL CKKSVector."""

    proto: bytes  #: the full CKKSVectorProto bytes
    proto_field: tuple[int, int]  #: (start, end) of the ``ciphertexts`` field in ``proto``
    version: tuple[int, int]  #: SEAL (major, minor) from the header
    compr_mode: int  #: compression of the original blob (0 none, 1 zlib, 2 zstd)
    payload: bytes  #: decompressed ``Ciphertext::save_members`` bytes
    parms_id: tuple[int, int, int, int]
    is_ntt_form: bool
    size: int  #: number of polynomials (2 for a fresh or relinearized ciphertext)
    poly_modulus_degree: int  #: N
    coeff_modulus_size: int  #: L at this ciphertext's level
    scale: float
    data_offset: int  #: byte offset of the coefficients in ``payload``

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size, self.coeff_modulus_size, self.poly_modulus_degree)


def _decode_seal_blob(blob: bytes) -> tuple[tuple[int, int], int, bytes]:
    if len(blob) < _SEAL_HEADER.size:
        raise ValueError(f"SEAL blob of {len(blob)} bytes is shorter than its 16-byte header")
    magic, header_size, major, minor, compr, _reserved, total = _SEAL_HEADER.unpack_from(blob)
    if magic != _SEAL_MAGIC or header_size != _SEAL_HEADER.size:
        raise ValueError(
            f"not a SEAL ciphertext blob (magic {magic:#06x}, header size {header_size}; "
            f"expected {_SEAL_MAGIC:#06x}, {_SEAL_HEADER.size})"
        )
    if total != len(blob):
        raise ValueError(f"SEAL header says {total} bytes but the blob has {len(blob)}")
    body = blob[_SEAL_HEADER.size :]
    if compr == _COMPR_NONE:
        payload = bytes(body)
    elif compr == _COMPR_ZLIB:
        import zlib

        payload = zlib.decompress(body)
    elif compr == _COMPR_ZSTD:
        payload = _zstd_decompress(body)
    else:
        raise ValueError(f"unknown SEAL compr_mode {compr}")
    return (major, minor), compr, payload


def parse_ckks_vector(ciphertext: Any) -> SealCiphertextLayout:
    """Serialize a TenSEAL ``CKKSVector`` and locate its SEAL ciphertext data."""
    ts = _import_tenseal()
    if not isinstance(ciphertext, ts.CKKSVector):
        raise TypeError(
            f"expected a tenseal.CKKSVector, got {type(ciphertext).__module__}."
            f"{type(ciphertext).__name__}"
        )
    proto = ciphertext.serialize()
    entries = [f for f in _proto_fields(proto) if f[0] == 2 and f[1] == 2]
    if len(entries) != 1:
        raise ValueError(
            f"a CKKSVector should hold exactly one SEAL ciphertext, this one has {len(entries)}"
        )
    _, _, start, value_start, end = entries[0]
    version, compr, payload = _decode_seal_blob(proto[value_start:end])
    if len(payload) < _META.size:
        raise ValueError("SEAL ciphertext payload is too short")
    *parms_id, is_ntt, size, n, limbs, scale = _META.unpack_from(payload)
    words = size * limbs * n
    data_offset = len(payload) - 8 * words
    # The coefficient block is preceded by the DynArray's element count.
    if data_offset < _META.size + 8 or struct.unpack_from("<Q", payload, data_offset - 8)[0] != (
        words
    ):
        raise ValueError(
            "unexpected SEAL ciphertext layout: the payload does not end with "
            f"size*L*N = {size}*{limbs}*{n} uint64 coefficients preceded by their count"
        )
    return SealCiphertextLayout(
        proto=proto,
        proto_field=(start, end),
        version=version,
        compr_mode=compr,
        payload=payload,
        parms_id=tuple(parms_id),  # type: ignore[arg-type]
        is_ntt_form=bool(is_ntt),
        size=size,
        poly_modulus_degree=n,
        coeff_modulus_size=limbs,
        scale=scale,
        data_offset=data_offset,
    )


# --------------------------------------------------------------------- moduli
def ckks_moduli(context: Any, parms_id: Any = None) -> Tensor:
    """The coefficient moduli ``[L]`` (int64) of ``parms_id`` in a TenSEAL context.

    ``parms_id`` defaults to the first data level (what fresh ciphertexts
    use: the key-level primes minus the special prime)."""
    _import_tenseal()
    seal_context = context.seal_context().data
    if parms_id is None:
        parms_id = seal_context.first_parms_id()
    context_data = seal_context.get_context_data(list(parms_id))
    if context_data is None:
        raise ValueError(
            f"parms_id {tuple(parms_id)} is not a level of this TenSEAL context "
            "(was the ciphertext made with another context?)"
        )
    values = [m.value() for m in context_data.parms().coeff_modulus()]
    return torch.tensor(values, dtype=torch.int64)


# ------------------------------------------------------------------ interop
def ckks_to_limbs(ciphertext: Any) -> tuple[Tensor, Tensor]:
    """Extract ``(limbs [size, L, N] int64, moduli [L] int64)`` from a TenSEAL
    ``CKKSVector`` (``size`` is 2 unless the ciphertext is unrelinearized).

    The limbs are SEAL's coefficients as stored (NTT form for CKKS), each in
    ``[0, q_l)``; the copy is independent of the ciphertext."""
    layout = parse_ckks_vector(ciphertext)
    moduli = ckks_moduli(ciphertext.context(), layout.parms_id)
    if moduli.shape[0] != layout.coeff_modulus_size:
        raise ValueError(
            f"ciphertext has {layout.coeff_modulus_size} limbs but its level has "
            f"{moduli.shape[0]} moduli"
        )
    words = np.frombuffer(
        layout.payload,
        dtype="<u8",
        count=layout.size * layout.coeff_modulus_size * layout.poly_modulus_degree,
        offset=layout.data_offset,
    )
    limbs = torch.from_numpy(words.astype(np.int64)).view(layout.shape)
    TorchRNSBackend().check_reduced(limbs, moduli)
    return limbs, moduli


def limbs_to_ckks(limbs: Tensor, template: Any, *, context: Any = None) -> Any:
    """Rebuild a TenSEAL ``CKKSVector`` like ``template`` (same context, level,
    scale, slot count, NTT form) but holding ``limbs`` ([size, L, N] int64,
    reduced modulo the template's moduli).

    ``context`` defaults to ``template.context()``."""
    ts = _import_tenseal()
    if not isinstance(limbs, Tensor):
        raise TypeError(f"limbs must be a torch.Tensor, got {type(limbs).__name__}")
    layout = parse_ckks_vector(template)
    if context is None:
        context = template.context()
    if tuple(limbs.shape) != layout.shape:
        raise ValueError(
            f"limbs have shape {tuple(limbs.shape)} but the template ciphertext is "
            f"[size, L, N] = {list(layout.shape)}"
        )
    if limbs.dtype != torch.int64:
        raise ValueError(f"limbs must have dtype torch.int64, got {limbs.dtype}")
    moduli = ckks_moduli(context, layout.parms_id)
    host = limbs.detach().to("cpu")
    TorchRNSBackend().check_reduced(host, moduli)

    coefficients = host.contiguous().numpy().astype("<u8", copy=False).tobytes()
    payload = layout.payload[: layout.data_offset] + coefficients
    header = _SEAL_HEADER.pack(
        _SEAL_MAGIC,
        _SEAL_HEADER.size,
        layout.version[0],
        layout.version[1],
        _COMPR_NONE,
        0,
        _SEAL_HEADER.size + len(payload),
    )
    blob = header + payload
    start, end = layout.proto_field
    field = b"\x12" + _encode_varint(len(blob)) + blob
    proto = layout.proto[:start] + field + layout.proto[end:]
    return ts.ckks_vector_from(context, proto)
