"""Raw RNS limbs in and out of TenSEAL (Microsoft SEAL) CKKS ciphertexts.

TenSEAL exposes no array view of a ciphertext's polynomials, so limbs are
read from, and written back into, its serialization:

``CKKSVector.serialize()``
    a protobuf ``CKKSVectorProto``: field 1 ``sizes`` (packed uint32, the
    number of used slots), field 2 ``ciphertexts`` (bytes, one per SEAL
    ciphertext), field 3 ``scale`` (double). A vector of up to N/2 values
    (the slot count) is one ciphertext; TenSEAL packs a longer one into
    C = ceil(n / slots) ciphertexts, chunk c holding values
    ``[c * slots, (c + 1) * slots)``. :func:`ckks_to_limbs` returns a
    one-ciphertext vector as ``[size, L, N]`` limbs and a longer one as
    ``[C, size, L, N]``, chunk by chunk; the ciphertext all-reduce sums along
    leading dimensions, so either shape is one `dist` program input.
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
modulus.

Keys travel the same way, inside a TenSEAL context's serialization
(``TenSEALContextProto``: field 1 the SEAL ``EncryptionParameters``, field 2
the public part -- 1 ``public_key``, 2 ``auto_flags``, 3 ``scale``, 4 relin
keys, 5 Galois keys --, field 3 the private part -- 1 ``secret_key`` --,
field 4 the encryption type).  A SEAL ``PublicKey`` is saved as its
ciphertext (size 2, at the *key* level: every prime, the special one
included, NTT form); a ``SecretKey`` as its plaintext (``Plaintext::
save_members``: ``parms_id``, ``coeff_count`` = K*N, ``scale``, then a
``DynArray<uint64>`` with its own header and count), the K*N NTT-form
coefficients laid out ``[limb][coefficient]``.  :func:`public_key_limbs`
and :func:`secret_key_limbs` read them; :func:`context_from_key_limbs`
builds a TenSEAL context around limbs computed elsewhere (a collective
public key, a secret key share).  TenSEAL and zstandard are imported
lazily (``pip install 'distir[he]'``).
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
    "CiphertextHeader",
    "SealCiphertextLayout",
    "ckks_moduli",
    "ckks_to_limbs",
    "context_from_key_limbs",
    "key_moduli",
    "limbs_to_ckks",
    "limbs_to_vector",
    "vector_proto",
    "parse_ckks_chunks",
    "parse_ckks_vector",
    "public_key_limbs",
    "secret_key_limbs",
]

_SEAL_MAGIC = 0xA15E
_SEAL_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, major, minor, compr, reserved, size
_COMPR_NONE, _COMPR_ZLIB, _COMPR_ZSTD = 0, 1, 2
_META = struct.Struct("<4QBQQQd")  # parms_id, is_ntt_form, size, N, L, scale
_PLAIN_META = struct.Struct("<4QQd")  # parms_id, coeff_count, scale

_INSTALL_HINT = "install distir[he] (pip install 'distir[he]': tenseal and zstandard)"


def import_tenseal() -> Any:
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


def _ciphertext_payload(payload: bytes) -> tuple[list[int], int, int, int, int, float, int]:
    """``(parms_id, is_ntt_form, size, N, L, scale, data_offset)`` of a
    decompressed ``Ciphertext::save_members`` payload."""
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
    return parms_id, is_ntt, size, n, limbs, scale, data_offset


def _encode_seal_blob(version: tuple[int, int], payload: bytes) -> bytes:
    """A SEAL object blob: the 16-byte header (no compression) and ``payload``."""
    header = _SEAL_HEADER.pack(
        _SEAL_MAGIC,
        _SEAL_HEADER.size,
        version[0],
        version[1],
        _COMPR_NONE,
        0,
        _SEAL_HEADER.size + len(payload),
    )
    return header + payload


def parse_ckks_chunks(ciphertext: Any) -> list[SealCiphertextLayout]:
    """Serialize a TenSEAL ``CKKSVector`` and locate the data of each of its
    SEAL ciphertexts (one per `slots` values, in order)."""
    ts = import_tenseal()
    if not isinstance(ciphertext, ts.CKKSVector):
        raise TypeError(
            f"expected a tenseal.CKKSVector, got {type(ciphertext).__module__}."
            f"{type(ciphertext).__name__}"
        )
    proto = ciphertext.serialize()
    entries = [f for f in _proto_fields(proto) if f[0] == 2 and f[1] == 2]
    if not entries:
        raise ValueError("this CKKSVector holds no SEAL ciphertext")
    layouts = []
    for _, _, start, value_start, end in entries:
        version, compr, payload = _decode_seal_blob(proto[value_start:end])
        parms_id, is_ntt, size, n, limbs, scale, data_offset = _ciphertext_payload(payload)
        layouts.append(
            SealCiphertextLayout(
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
        )
    first = layouts[0]
    for layout in layouts[1:]:
        if (layout.parms_id, layout.shape) != (first.parms_id, first.shape):
            raise ValueError(
                "the SEAL ciphertexts of this CKKSVector differ in level or shape: "
                f"{list(first.shape)} and {list(layout.shape)}"
            )
    return layouts


def parse_ckks_vector(ciphertext: Any) -> SealCiphertextLayout:
    """The layout of a ``CKKSVector`` that is one SEAL ciphertext (at most
    `slots` values); :func:`parse_ckks_chunks` reads longer ones."""
    layouts = parse_ckks_chunks(ciphertext)
    if len(layouts) != 1:
        raise ValueError(
            f"this CKKSVector holds {len(layouts)} SEAL ciphertexts (more values than "
            "slots); read it with parse_ckks_chunks or ckks_to_limbs"
        )
    return layouts[0]


# --------------------------------------------------------------------- moduli
def ckks_moduli(context: Any, parms_id: Any = None) -> Tensor:
    """The coefficient moduli ``[L]`` (int64) of ``parms_id`` in a TenSEAL context.

    ``parms_id`` defaults to the first data level (what fresh ciphertexts
    use: the key-level primes minus the special prime)."""
    import_tenseal()
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
def ckks_to_limbs(
    ciphertext: Any, *, layouts: list[SealCiphertextLayout] | None = None
) -> tuple[Tensor, Tensor]:
    """Extract ``(limbs, moduli [L] int64)`` from a TenSEAL ``CKKSVector``:
    limbs ``[size, L, N]`` int64 for a vector of at most `slots` values,
    ``[C, size, L, N]`` for one TenSEAL packed into C ciphertexts (see the
    module docstring); ``size`` is 2 unless the ciphertext is unrelinearized.

    The limbs are SEAL's coefficients as stored (NTT form for CKKS), each in
    ``[0, q_l)``; the copy is independent of the ciphertext.  ``layouts``:
    :func:`parse_ckks_chunks` of this ciphertext, when the caller has them
    (serializing is most of the cost)."""
    if layouts is None:
        layouts = parse_ckks_chunks(ciphertext)
    layout = layouts[0]
    moduli = ckks_moduli(ciphertext.context(), layout.parms_id)
    if moduli.shape[0] != layout.coeff_modulus_size:
        raise ValueError(
            f"ciphertext has {layout.coeff_modulus_size} limbs but its level has "
            f"{moduli.shape[0]} moduli"
        )
    chunks = []
    for chunk in layouts:
        words = np.frombuffer(
            chunk.payload,
            dtype="<u8",
            count=chunk.size * chunk.coeff_modulus_size * chunk.poly_modulus_degree,
            offset=chunk.data_offset,
        )
        chunks.append(torch.from_numpy(words.astype(np.int64)).view(chunk.shape))
    limbs = chunks[0] if len(chunks) == 1 else torch.stack(chunks)
    TorchRNSBackend().check_reduced(limbs, moduli)
    return limbs, moduli


def limbs_to_ckks(limbs: Tensor, template: Any, *, context: Any = None) -> Any:
    """Rebuild a TenSEAL ``CKKSVector`` like ``template`` (same context, level,
    scale, slot count, NTT form, number of ciphertexts) but holding ``limbs``
    (int64 reduced modulo the template's moduli, shaped as
    :func:`ckks_to_limbs` returns the template's).

    ``context`` defaults to ``template.context()``."""
    ts = import_tenseal()
    if not isinstance(limbs, Tensor):
        raise TypeError(f"limbs must be a torch.Tensor, got {type(limbs).__name__}")
    layouts = parse_ckks_chunks(template)
    layout = layouts[0]
    if context is None:
        context = template.context()
    shape = layout.shape if len(layouts) == 1 else (len(layouts), *layout.shape)
    if tuple(limbs.shape) != shape:
        what = "[size, L, N]" if len(layouts) == 1 else "[C ciphertexts, size, L, N]"
        raise ValueError(
            f"limbs have shape {tuple(limbs.shape)} but the template ciphertext is "
            f"{what} = {list(shape)}"
        )
    if limbs.dtype != torch.int64:
        raise ValueError(f"limbs must have dtype torch.int64, got {limbs.dtype}")
    moduli = ckks_moduli(context, layout.parms_id)
    host = limbs.detach().to("cpu")
    TorchRNSBackend().check_reduced(host, moduli)
    chunks = [host] if len(layouts) == 1 else list(host)

    proto = layout.proto
    # From the last field to the first, so that earlier offsets stay valid.
    for chunk, limbs_of_chunk in reversed(list(zip(layouts, chunks, strict=True))):
        coefficients = limbs_of_chunk.contiguous().numpy().astype("<u8", copy=False).tobytes()
        blob = _encode_seal_blob(chunk.version, chunk.payload[: chunk.data_offset] + coefficients)
        start, end = chunk.proto_field
        proto = proto[:start] + _bytes_field(2, blob) + proto[end:]
    return ts.ckks_vector_from(context, proto)


@dataclass(frozen=True)
class CiphertextHeader:
    """Everything a one-ciphertext ``CKKSVector``'s serialization holds but
    its coefficients, kept from one :func:`parse_ckks_chunks`: other limbs
    are written into the same format (:func:`limbs_to_vector`) without
    serializing (and decompressing) the vector again."""

    version: tuple[int, int]
    prefix: bytes  #: the payload up to the coefficients (metadata, DynArray header)
    fields: tuple[tuple[int, bytes], ...]  #: the proto's other fields: (number, raw bytes)
    shape: tuple[int, int, int]

    @classmethod
    def of(cls, layouts: list[SealCiphertextLayout]) -> CiphertextHeader:
        """The header of the vector ``layouts`` describes (one ciphertext)."""
        if len(layouts) != 1:
            raise ValueError(
                f"a CiphertextHeader describes one SEAL ciphertext, this vector holds {len(layouts)}"
            )
        layout = layouts[0]
        fields = tuple(
            (number, layout.proto[start:end])
            for number, _wire, start, _value, end in _proto_fields(layout.proto)
            if number != 2
        )
        return cls(layout.version, layout.payload[: layout.data_offset], fields, layout.shape)


def limbs_to_vector(limbs: Tensor, headers: list[CiphertextHeader], context: Any) -> Any:
    """One TenSEAL ``CKKSVector`` holding ``limbs`` (int64 ``[C, size, L,
    N]``, reduced) as its C SEAL ciphertexts, ciphertext ``k`` in the format
    of ``headers[k]`` (uncompressed: SEAL validates every limb on load); its
    values are every ciphertext's in order, so one ``decrypt()`` decodes them
    all.  The headers must agree on every field but the number of values
    (the scale: ``ValueError`` otherwise)."""
    return import_tenseal().ckks_vector_from(context, vector_proto(limbs, headers))


def vector_proto(limbs: Tensor, headers: list[CiphertextHeader]) -> bytes:
    """The serialization (uncompressed) of :func:`limbs_to_vector`'s vector:
    what ``ts.ckks_vector_from`` loads, with no TenSEAL call to make it."""
    if limbs.dim() != 4 or limbs.shape[0] != len(headers) or limbs.dtype != torch.int64:
        raise ValueError(
            f"limbs must be int64 [C, size, L, N] for {len(headers)} headers, got "
            f"{limbs.dtype} {list(limbs.shape)}"
        )
    others = [tuple(f for f in h.fields if f[0] != 1) for h in headers]
    if any(o != others[0] for o in others) or any(
        tuple(limbs.shape[1:]) != h.shape for h in headers
    ):
        raise ValueError("the ciphertexts differ in scale or shape: one vector cannot hold them")
    host = limbs.detach().to("cpu").contiguous()
    # ``sizes`` (field 1: the number of values of each ciphertext), packed
    # or not, concatenated in order.
    packed, loose = bytearray(), []
    for h in headers:
        for number, raw in h.fields:
            if number == 1:
                ((_n, wire, _start, value, end),) = _proto_fields(raw)
                if wire == 2:
                    packed += raw[value:end]
                else:
                    loose.append(raw)
    parts = ([_bytes_field(1, bytes(packed))] if packed else []) + loose
    for h, chunk in zip(headers, host, strict=True):
        coefficients = chunk.numpy().astype("<u8", copy=False).tobytes()
        parts.append(_bytes_field(2, _encode_seal_blob(h.version, h.prefix + coefficients)))
    parts += [raw for _number, raw in others[0]]
    return b"".join(parts)


# ------------------------------------------------------------------------ keys
# TenSEALContextProto fields (tenseal/proto/tensealcontext.proto).
_CTX_PUBLIC, _CTX_PRIVATE = 2, 3
_PUBLIC_KEY, _SECRET_KEY = 1, 1  # in the public and private parts


def _bytes_field(number: int, value: bytes) -> bytes:
    """One length-delimited protobuf field."""
    return _encode_varint(number << 3 | 2) + _encode_varint(len(value)) + value


def _bytes_fields(proto: bytes, number: int) -> list[bytes]:
    return [proto[v:e] for n, w, _s, v, e in _proto_fields(proto) if n == number and w == 2]


def _replace_bytes_field(proto: bytes, number: int, value: bytes | None) -> bytes:
    """``proto`` with every length-delimited field ``number`` replaced by
    ``value`` (dropped when ``value`` is None; appended when absent)."""
    out, done = bytearray(), False
    for n, w, start, _v, end in _proto_fields(proto):
        if n == number and w == 2:
            if value is not None and not done:
                out += _bytes_field(number, value)
                done = True
        else:
            out += proto[start:end]
    if value is not None and not done:
        out += _bytes_field(number, value)
    return bytes(out)


def _context_proto(context: Any, *, secret: bool) -> bytes:
    ts = import_tenseal()
    if not isinstance(context, ts.Context):
        raise TypeError(
            f"expected a tenseal.Context, got {type(context).__module__}.{type(context).__name__}"
        )
    if secret and not context.has_secret_key():
        raise ValueError("this TenSEAL context holds no secret key (it is public)")
    return context.serialize(
        save_public_key=True,
        save_secret_key=secret,
        save_galois_keys=False,
        save_relin_keys=False,
    )


def _only(fields: list[bytes], what: str) -> bytes:
    if len(fields) != 1:
        raise ValueError(f"a TenSEAL context should hold exactly one {what}, found {len(fields)}")
    return fields[0]


def key_moduli(context: Any) -> Tensor:
    """The key-level moduli ``[K]`` (int64) of a TenSEAL context: every
    coefficient-modulus prime, the special (last) one included.  Keys live
    at this level; fresh ciphertexts at the first data level, its first
    ``K - 1`` primes."""
    import_tenseal()
    return ckks_moduli(context, context.seal_context().data.key_parms_id())


def public_key_limbs(context: Any) -> Tensor:
    """The public key of a TenSEAL context as int64 limbs ``[2, K, N]``:
    ``(b, a)`` in NTT form at the key level, with ``b + a*s = -e`` for the
    secret ``s`` and a small error ``e`` (SEAL's ``KeyGenerator``)."""
    public = _only(_bytes_fields(_context_proto(context, secret=False), _CTX_PUBLIC), "public part")
    blob = _only(_bytes_fields(public, _PUBLIC_KEY), "public key")
    _version, _compr, payload = _decode_seal_blob(blob)
    _pid, is_ntt, size, n, limbs, _scale, offset = _ciphertext_payload(payload)
    if not is_ntt or size != 2:
        raise ValueError(f"unexpected SEAL public key: size {size}, NTT form {bool(is_ntt)}")
    words = np.frombuffer(payload, dtype="<u8", count=size * limbs * n, offset=offset)
    return torch.from_numpy(words.astype(np.int64)).view(size, limbs, n)


def secret_key_limbs(context: Any) -> Tensor:
    """The secret key of a private TenSEAL context as int64 limbs ``[K, N]``
    (NTT form at the key level; SEAL samples it ternary)."""
    private = _only(
        _bytes_fields(_context_proto(context, secret=True), _CTX_PRIVATE), "private part"
    )
    blob = _only(_bytes_fields(private, _SECRET_KEY), "secret key")
    _version, _compr, payload = _decode_seal_blob(blob)
    if len(payload) < _PLAIN_META.size:
        raise ValueError("SEAL secret key payload is too short")
    *_pid, coeff_count, _scale = _PLAIN_META.unpack_from(payload)
    offset = len(payload) - 8 * coeff_count
    if offset < _PLAIN_META.size + 8 or struct.unpack_from("<Q", payload, offset - 8)[0] != (
        coeff_count
    ):
        raise ValueError("unexpected SEAL secret key layout")
    limbs = key_moduli(context).numel()
    words = np.frombuffer(payload, dtype="<u8", count=coeff_count, offset=offset)
    return torch.from_numpy(words.astype(np.int64)).view(limbs, coeff_count // limbs)


def _check_key_limbs(limbs: Tensor, moduli: Tensor, shape: tuple[int, ...], what: str) -> Tensor:
    if not isinstance(limbs, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(limbs).__name__}")
    if tuple(limbs.shape) != shape:
        raise ValueError(f"{what} must have shape {list(shape)}, got {list(limbs.shape)}")
    if limbs.dtype != torch.int64:
        raise ValueError(f"{what} limbs must have dtype torch.int64, got {limbs.dtype}")
    host = limbs.detach().to("cpu").contiguous()
    TorchRNSBackend().check_reduced(host, moduli)
    return host


def context_from_key_limbs(
    template: Any, *, public_key: Tensor | None = None, secret_key: Tensor | None = None
) -> Any:
    """A TenSEAL context with ``template``'s encryption parameters, global
    scale and flags, holding the given keys and no others.

    ``public_key`` is ``[2, K, N]`` int64 (``(b, a)``, NTT form, key level:
    what :func:`public_key_limbs` returns); ``secret_key`` is ``[K, N]``
    int64 (NTT form, key level).  Each must be reduced modulo
    :func:`key_moduli`.  Without ``secret_key`` the context is public
    (``is_private()`` is False: it encrypts, it cannot decrypt); without
    ``public_key`` it cannot encrypt.  Relinearization and Galois keys are
    never carried over (they belong to the template's secret).  SEAL
    validates both keys when the context loads."""
    ts = import_tenseal()
    proto = _context_proto(template, secret=False)
    moduli = key_moduli(template)
    public = _only(_bytes_fields(proto, _CTX_PUBLIC), "public part")
    pk_blob = None
    if public_key is not None:
        template_blob = _only(_bytes_fields(public, _PUBLIC_KEY), "public key")
        version, _compr, payload = _decode_seal_blob(template_blob)
        _pid, _ntt, size, n, limbs, _scale, offset = _ciphertext_payload(payload)
        host = _check_key_limbs(public_key, moduli, (size, limbs, n), "public_key")
        coefficients = host.numpy().astype("<u8", copy=False).tobytes()
        pk_blob = _encode_seal_blob(version, payload[:offset] + coefficients)
    proto = _replace_bytes_field(
        proto, _CTX_PUBLIC, _replace_bytes_field(public, _PUBLIC_KEY, pk_blob)
    )
    if secret_key is not None:
        n = template.seal_context().data.key_context_data().parms().poly_modulus_degree()
        host = _check_key_limbs(secret_key, moduli, (moduli.numel(), n), "secret_key")
        version = _decode_seal_blob(_only(_bytes_fields(public, _PUBLIC_KEY), "public key"))[0]
        words = host.numel()
        dyn_array = _SEAL_HEADER.pack(
            _SEAL_MAGIC,
            _SEAL_HEADER.size,
            version[0],
            version[1],
            _COMPR_NONE,
            0,
            _SEAL_HEADER.size + 8 + 8 * words,
        ) + struct.pack("<Q", words)
        parms_id = template.seal_context().data.key_parms_id()
        payload = (
            _PLAIN_META.pack(*parms_id, words, 1.0)
            + dyn_array
            + host.numpy().astype("<u8", copy=False).tobytes()
        )
        private = _bytes_field(_SECRET_KEY, _encode_seal_blob(version, payload))
        proto = _replace_bytes_field(proto, _CTX_PRIVATE, private)
    return ts.context_from(proto)
