"""The tag of a signed entry (format version 6), checked over the raw header bytes before
anything in them is parsed.

A version-6 entry's metadata holds ``header_tag``: ``<xxh3-128 hex>:<key id>:<HMAC-SHA256
hex>``. Both digests are computed over the header exactly as written, with the two hex parts
of the tag itself zeroed (``PLACEHOLDER``: written first, replaced in place, so the header keeps
its length); the HMAC also covers the storage key (an entry copied under another name fails).
A reader finds the tag by a strict byte search (one ``"header_tag":`` in the header, of exactly
that form), zeroes it again and checks:

- the xxh3-128 checksum: a mismatch is damage (``EntryError``: the entry may be rewritten);
- the key id and the HMAC: a key this store does not accept, or a mismatch over an intact
  header, is a forgery or another deployment's entry (``AuthError``: never overwritten), one
  signed with a retired key a miss that may be rewritten.

Only a header whose tag verifies is parsed as JSON (``header.loads``) in a store with keys;
older signed entries (version 5, tag over the parsed metadata: ``auth.authenticate``) are still
read, their headers parsed by the same strict, depth-checked parser first.
"""

from __future__ import annotations

import hashlib
import hmac
import re

import xxhash

from blendrag.store.auth import StoreKeys
from blendrag.store.errors import AuthError, EntryError

FIELD = "header_tag"
_NEEDLE = b'"header_tag":'
_TAG = re.compile(rb'"header_tag":"([0-9a-f]{32}):([A-Za-z0-9_.-]{1,64}):([0-9a-f]{64})"')
_DOMAIN = b"blendrag-entry-header-v6\0"


def placeholder(key_id: str) -> str:
    """The tag field's value as first written (both digests zeroed)."""
    return f"{'0' * 32}:{key_id}:{'0' * 64}"


def locate(raw: bytes) -> re.Match[bytes] | None:
    """The tag in header bytes ``raw``, None when there is none (an older or unsigned entry);
    ``EntryError`` when the field is there but not exactly once in its one form (damage)."""
    count = raw.count(_NEEDLE)
    if not count:
        return None
    found = _TAG.search(raw)
    if count != 1 or found is None:
        raise EntryError("damaged header tag")
    return found


def _zeroed(raw: bytes, tag: re.Match[bytes]) -> bytes:
    (a, b), (c, d) = tag.span(1), tag.span(3)
    return raw[:a] + b"0" * (b - a) + raw[b:c] + b"0" * (d - c) + raw[d:]


def _hmac(secret: bytes, key: str, zeroed: bytes) -> str:
    return hmac.new(secret, _DOMAIN + key.encode() + b"\0" + zeroed, hashlib.sha256).hexdigest()


def check_sum(raw: bytes, tag: re.Match[bytes]) -> bytes:
    """The header with its tag zeroed; ``EntryError`` when its checksum fails (damage)."""
    zeroed = _zeroed(raw, tag)
    if xxhash.xxh3_128_hexdigest(zeroed) != tag.group(1).decode():
        raise EntryError("header checksum mismatch")
    return zeroed


def check_tag(zeroed: bytes, tag: re.Match[bytes], key: str, keys: StoreKeys) -> None:
    """``AuthError`` unless ``keys`` accept the tag's key and its HMAC over ``zeroed`` (the
    header whose checksum passed) and the storage ``key``."""
    key_id = tag.group(2).decode()
    if key_id in keys.retired:
        raise AuthError(f"signed with retired key {key_id!r}", retired=True)
    if key_id not in keys.secrets:
        raise AuthError(f"signed with key {key_id!r}, which this store does not have")
    if not hmac.compare_digest(_hmac(keys.secrets[key_id], key, zeroed), tag.group(3).decode()):
        raise AuthError("entry not authenticated: tag mismatch (forged, another deployment's "
                        "or written for another name)")


def seal_header(data: bytes, key: str, keys: StoreKeys) -> bytes:
    """An encoded entry whose header holds ``placeholder(keys.active)`` with the tag filled in:
    the checksum and the active key's HMAC, in place."""
    n = int.from_bytes(data[:8], "little")
    raw = data[8:8 + n]
    tag = locate(raw)
    if tag is None or tag.group(2).decode() != keys.active:
        raise ValueError("the entry's header holds no tag placeholder to fill in")
    checksum = xxhash.xxh3_128_hexdigest(raw).encode()
    mac = _hmac(keys.secrets[keys.active], key, raw).encode()
    (a, b), (c, d) = tag.span(1), tag.span(3)
    filled = raw[:a] + checksum + raw[b:c] + mac + raw[d:]
    return data[:8] + filled + data[8 + n:]
