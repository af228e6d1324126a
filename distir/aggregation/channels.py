"""Pairwise authenticated, encrypted channels for the secrets a threshold
protocol hands from rank to rank (Shamir shares of secret keys) and for
its secret-dependent values (decryption and key-switch shares).

gloo's TCP is clear text, so a secret never travels through a plain
collective.  Every rank draws a fresh X25519 key pair per session and
publishes its public key through a distir all-gather; the pair ``(i, j)``
derives, with HKDF-SHA256 over the X25519 shared secret, one key per
direction and purpose bound to both ranks, both public keys, the purpose,
and a transcript: the
session (the parameters and public seed), every rank's public key as this
rank received them, and what the caller binds (:meth:`Channels.bind`: key
generation binds the collective public key), so that two ranks with
different views of any of it cannot talk; each message is sealed once with
ChaCha20-Poly1305 under its own key (so a fixed nonce never repeats), with
the sender, the receiver and the purpose as associated data.  Every
primitive is the ``cryptography`` package's.

What this does not give: authentication of the public keys themselves.  A
network attacker who can rewrite the all-gather can substitute its own key
and read the shares; run the ranks over an authenticated transport
(WireGuard or IPsec between hosts, or a TLS-capable transport), or bind the
X25519 keys to the ranks with a PKI.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from distir.errors import DistirError

__all__ = ["ChannelError", "Channels", "PUBLIC_KEY_BYTES", "TAG_BYTES"]

PUBLIC_KEY_BYTES = 32
TAG_BYTES = 16
_INFO = b"distir/threshold/v1/channel"
_NONCE = bytes(12)  # every key seals exactly one message


class ChannelError(DistirError):
    """A sealed message failed authentication (tampered, or not for this rank)."""


class Channels:
    """This rank's end of the pairwise channels of one session."""

    def __init__(self, rank: int, session: bytes):
        self.rank = rank
        self._session = bytes(session)
        self._private = X25519PrivateKey.generate()
        self.public_key = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self._peers: list[bytes] | None = None
        self._salt = self._session
        self._sealed: set[tuple[int, bytes]] = set()

    def __repr__(self) -> str:
        return f"Channels(rank={self.rank})"

    def connect(self, public_keys: Sequence[bytes]) -> None:
        """Every rank's public key, in rank order (this rank's own included)."""
        if public_keys[self.rank] != self.public_key:
            raise ChannelError(f"rank {self.rank}'s public key came back altered")
        self._peers = [bytes(k) for k in public_keys]
        self._salt = hashlib.sha256(self._session + b"".join(self._peers)).digest()

    def bind(self, transcript: bytes) -> None:
        """Bind every later key to ``transcript`` too (before any message)."""
        if self._peers is None or self._sealed:
            raise ChannelError("bind() goes after connect() and before any message")
        self._salt = hashlib.sha256(self._salt + bytes(transcript)).digest()

    def _key(self, sender: int, receiver: int, purpose: bytes) -> ChaCha20Poly1305:
        if self._peers is None:
            raise ChannelError("channels used before connect()")
        peer = receiver if sender == self.rank else sender
        shared = self._private.exchange(X25519PublicKey.from_public_bytes(self._peers[peer]))
        # The purpose is in the key, not only in the associated data: every
        # (direction, purpose) seals one message under the fixed nonce, so
        # two purposes (a stream's slices) never share a keystream.
        info = (
            _INFO
            + sender.to_bytes(4, "little")
            + receiver.to_bytes(4, "little")
            + self._peers[sender]
            + self._peers[receiver]
            + hashlib.sha256(purpose).digest()
        )
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=self._salt, info=info).derive(shared)
        return ChaCha20Poly1305(key)

    @staticmethod
    def _aad(sender: int, receiver: int, purpose: bytes) -> bytes:
        return sender.to_bytes(4, "little") + receiver.to_bytes(4, "little") + purpose

    def seal(self, receiver: int, data: bytes, purpose: bytes) -> bytes:
        """``data`` encrypted and authenticated for ``receiver`` (len + 16 bytes)."""
        if (receiver, purpose) in self._sealed:
            raise ChannelError(f"rank {self.rank} already sealed a {purpose!r} for {receiver}")
        self._sealed.add((receiver, purpose))
        aad = self._aad(self.rank, receiver, purpose)
        return self._key(self.rank, receiver, purpose).encrypt(_NONCE, data, aad)

    def open(self, sender: int, blob: bytes, purpose: bytes) -> bytes:
        """The plaintext of what ``sender`` sealed for this rank."""
        aad = self._aad(sender, self.rank, purpose)
        try:
            return self._key(sender, self.rank, purpose).decrypt(_NONCE, blob, aad)
        except InvalidTag:
            raise ChannelError(
                f"rank {self.rank}: the message from rank {sender} failed authentication"
            ) from None
