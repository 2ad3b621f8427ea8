"""Entries encrypted at rest: AES-256-GCM over an entry's bytes, for tiers outside the
deployment's trust boundary (``StoreConfig(encrypt=True)``).

A sealed entry is ``MAGIC``, the key id (one length byte, then the id), a 12-byte random nonce
and the ciphertext with its 16-byte tag; the associated data is the stored name, so a sealed
entry copied under another name does not open. The cipher key is derived from the store key
(``StoreKeys.cipher_key``), never the signing secret itself. Inside, the entry is signed as
any other (``codec.py``). A sealed entry is read whole: its layers cannot be read apart.
"""

from __future__ import annotations

import os

from blendrag.store.auth import StoreKeys
from blendrag.store.errors import AuthError

MAGIC = b"BRSEAL1\0"
NONCE = 12


def require_cipher() -> None:
    """ImportError naming the extra unless ``cryptography`` is installed."""
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
    except ImportError:
        raise ImportError("encrypted KV entries need the cryptography package: "
                          "pip install blendrag[crypto]") from None


def seal(data: bytes, name: str, keys: StoreKeys) -> bytes:
    """``data`` encrypted under the active key, bound to the stored ``name``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key_id = keys.active.encode()
    nonce = os.urandom(NONCE)
    box = AESGCM(keys.cipher_key(keys.active)).encrypt(nonce, data, name.encode())
    return MAGIC + bytes([len(key_id)]) + key_id + nonce + box


def unseal(blob: bytes, name: str, keys: StoreKeys) -> bytes:
    """The entry bytes inside ``blob``; ``AuthError`` for anything that does not open under an
    accepted key with ``name`` as associated data."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 1:
        raise AuthError("not an encrypted entry (this store encrypts every entry)")
    at = len(MAGIC) + 1
    key_id = blob[at:at + blob[len(MAGIC)]].decode(errors="replace")
    at += blob[len(MAGIC)]
    if key_id in keys.retired:
        raise AuthError(f"encrypted with retired key {key_id!r}", retired=True)
    if key_id not in keys.secrets:
        raise AuthError(f"encrypted with key {key_id!r}, which this store does not have")
    nonce, box = blob[at:at + NONCE], blob[at + NONCE:]
    try:
        return AESGCM(keys.cipher_key(key_id)).decrypt(nonce, box, name.encode())
    except (InvalidTag, ValueError):
        raise AuthError("encrypted entry does not open (forged, damaged or moved)") from None
