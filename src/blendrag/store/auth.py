"""The deployment's store keys: what signs entries, verifies them, names them and encrypts them.

A shared tier (Redis, S3, a shared folder) is written by every process that can reach it. The
checksums inside an entry catch damage, not forgery: anyone who can write there could store
rows under a valid key. With ``StoreConfig(auth_key=StoreKeys...)`` every entry a byte tier
writes carries an HMAC-SHA256 tag over its storage key and raw header bytes (whose per-tensor
SHA-256 digests cover the payload), made with the *active* key and naming it by id; a read
checks the tag before the header is parsed (``signed_header.py``; entries signed before,
version 5, carry a tag over their parsed metadata: ``authenticate``). Keys rotate: a new
active key signs new entries while the old one, still *accepted*, verifies the entries it
signed; once the old one is *retired* its entries are misses that may be rewritten under the
new key.

Stored names are keyed too (``names.py``): HMAC under the *naming* key, which stays the same
across rotations (renaming would orphan every entry), so someone who can list the store
cannot test whether a guessed passage is in it.

Secrets never appear in a repr, a log line or an error message. ``from_env`` and ``from_file``
keys pickle as where they came from: a worker process (Ray, LlamaIndex's workers) reads them
from its own environment or file, and the secret does not travel with the job.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from blendrag.store.errors import AuthError
from blendrag.store.header import Refusals, loads

SHA256 = "sha256:"  # the prefix of a signed entry's tensor digests
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
HEX_DIGITS = frozenset("0123456789abcdef")  # a hexdigest's
MIN_SECRET = 16  # bytes: HMAC-SHA256 keys shorter than this are guessable


@dataclass(frozen=True)
class StoreKeys:
    """The store keys of a deployment.

    secrets:  key id -> secret (at least 16 bytes): every key that verifies
    active:   the id of the key that signs what this process writes
    naming:   the id of the key stored names are keyed with (default: ``active``); keep it when
              rotating, or every stored name changes
    retired:  key ids no longer accepted: their entries are misses that may be overwritten
              (an entry under an id neither accepted nor retired is never overwritten: it may
              be a newer key this process does not have yet)
    """

    secrets: Mapping[str, bytes] = field(repr=False)
    active: str
    naming: str | None = None
    retired: tuple[str, ...] = ()
    source: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    refusals: Refusals = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secrets, Mapping) or not self.secrets:
            raise ValueError("StoreKeys.secrets must map at least one key id to its secret")
        for key_id, secret in self.secrets.items():
            _check_id(key_id)
            if not isinstance(secret, bytes) or len(secret) < MIN_SECRET:
                raise ValueError(f"StoreKeys: the secret of key {key_id!r} must be at least "
                                 f"{MIN_SECRET} bytes")
        object.__setattr__(self, "secrets", dict(self.secrets))
        object.__setattr__(self, "retired", tuple(self.retired))
        if self.naming is None:
            object.__setattr__(self, "naming", self.active)
        for role in ("active", "naming"):
            if getattr(self, role) not in self.secrets:
                raise ValueError(f"StoreKeys.{role} names key {getattr(self, role)!r}, which "
                                 f"is not among the secrets ({', '.join(self.secrets)})")
        if set(self.retired) & set(self.secrets):
            raise ValueError("StoreKeys: a retired key id cannot also be accepted: "
                             f"{sorted(set(self.retired) & set(self.secrets))}")
        # headers these keys refused for their tag (by digest of the header and storage key):
        # refused again without being checked (``tensors.py``); not a field, never pickled
        object.__setattr__(self, "refusals", Refusals())

    # -- where keys come from -----------------------------------------------------------------

    @classmethod
    def parse(cls, text: str, source: tuple[str, str] | None = None) -> StoreKeys:
        """Keys from text: ``id=secret`` entries separated by commas or new lines (the secret in
        hex or base64, at least 16 bytes), the first one active; ``naming=id`` and
        ``retired=id1 id2`` entries set those roles."""
        secrets: dict[str, bytes] = {}
        roles: dict[str, str] = {}
        for item in (p.strip() for p in text.replace("\n", ",").split(",")):
            if not item or item.startswith("#"):
                continue
            name, sep, value = item.partition("=")
            if not sep:
                raise ValueError("store keys are id=secret entries; one entry has no '='")
            name, value = name.strip(), value.strip()
            if name in ("naming", "retired"):
                roles[name] = value
            else:
                secrets[name] = _secret(name, value)
        if not secrets:
            raise ValueError("no store key found (expected id=secret entries)")
        return cls(secrets, next(iter(secrets)), roles.get("naming"),
                   tuple(roles.get("retired", "").split()), source)

    @classmethod
    def from_env(cls, variable: str = "BLENDRAG_STORE_KEYS") -> StoreKeys:
        """Keys from an environment variable (``parse``'s format); read again in each process
        the keys are pickled into."""
        text = os.environ.get(variable)
        if not text:
            raise ValueError(f"store keys: the environment variable {variable} is not set")
        return cls.parse(text, ("env", variable))

    @classmethod
    def from_file(cls, path: str | Path) -> StoreKeys:
        """Keys from a file (``parse``'s format); read again in each process the keys are
        pickled into."""
        path = Path(path).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"store keys: cannot read {path}: {exc.strerror}") from None
        return cls.parse(text, ("file", str(path)))

    def __reduce__(self):
        if self.source is not None:  # the secrets are read again there, the roles travel
            return (_from_source, (self.source, tuple(self.secrets), self.active, self.naming,
                                   self.retired))
        return (StoreKeys, (self.secrets, self.active, self.naming, self.retired))

    # -- what they do ---------------------------------------------------------------------------

    def sign(self, message: bytes) -> str:
        """``<active id>:<HMAC-SHA256 hex>`` of ``message``."""
        tag = hmac.new(self.secrets[self.active], message, hashlib.sha256).hexdigest()
        return f"{self.active}:{tag}"

    def verify(self, tag: str, message: bytes) -> str | None:
        """None when ``tag`` is a valid tag of ``message`` under an accepted key; else why not
        (no key id in it, a retired key, a key this store does not have, a mismatch)."""
        key_id, sep, digest = tag.partition(":")
        # a SHA-256 hex digest, checked before compare_digest, which raises on non-ASCII text
        if not sep or len(digest) != 64 or not set(digest) <= HEX_DIGITS:
            return "malformed tag"
        if key_id in self.retired:
            return f"signed with retired key {key_id!r}"
        if key_id not in self.secrets:
            return f"signed with key {key_id!r}, which this store does not have"
        want = hmac.new(self.secrets[key_id], message, hashlib.sha256).hexdigest()
        return None if hmac.compare_digest(want, digest) else "tag mismatch"

    def is_retired(self, tag: str | None) -> bool:
        """Whether ``tag`` names a retired key (its entry may be overwritten)."""
        return tag is not None and tag.partition(":")[0] in self.retired

    def name(self, *parts: str) -> str:
        """HMAC-SHA256 hex of ``parts`` under the naming key: a stored name that does not tell
        what it names."""
        message = "\0".join(parts).encode()
        return hmac.new(self.secrets[str(self.naming)], message, hashlib.sha256).hexdigest()

    def cipher_key(self, key_id: str) -> bytes:
        """The AES-256 key derived from key ``key_id`` (never the signing secret itself)."""
        return hmac.new(self.secrets[key_id], b"blendrag-entry-encryption",
                        hashlib.sha256).digest()


def _from_source(source: tuple[str, str], ids: tuple[str, ...], active: str,
                 naming: str | None, retired: tuple[str, ...]) -> StoreKeys:
    """Keys unpickled: the secrets of key ``ids`` read again from ``source`` (an environment
    variable or a file), every role as it was pickled (a ``dataclasses.replace`` copy keeps
    its own active, naming and retired keys)."""
    kind, where = source
    loaded = StoreKeys.from_env(where) if kind == "env" else StoreKeys.from_file(where)
    absent = [key_id for key_id in ids if key_id not in loaded.secrets]
    if absent:
        raise ValueError(f"store keys: {kind} {where} no longer holds key(s) "
                         f"{', '.join(absent)}")
    secrets = {key_id: loaded.secrets[key_id] for key_id in ids}
    return StoreKeys(secrets, active, naming, retired, source)


def _check_id(key_id: object) -> None:
    if not isinstance(key_id, str) or not key_id or not set(key_id) <= _ID_CHARS:
        raise ValueError(f"StoreKeys: a key id is letters, digits, '-', '_' or '.', got "
                         f"{key_id!r}")


def _secret(key_id: str, value: str) -> bytes:
    """A secret from hex, else base64; never echoed in an error."""
    _check_id(key_id)
    try:
        return bytes.fromhex(value)
    except ValueError:
        pass
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"store keys: the secret of key {key_id!r} is neither hex nor "
                         "base64") from None


# ---- an entry's tag ---------------------------------------------------------------------

def signed_bytes(meta: dict[str, str]) -> bytes:
    """What an entry's tag covers: every metadata field but the tag, as sorted JSON (the
    storage key, shape, token ids and each tensor's SHA-256 digest among them)."""
    body = {k: v for k, v in meta.items() if k != "auth"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def authenticate(meta: dict | None, keys: StoreKeys) -> None:
    """AuthError unless ``meta`` carries a tag that ``keys`` verify and every tensor digest it
    covers is a SHA-256 one; checked before any other field is read."""
    tag = meta.get("auth") if meta else None
    if meta is None or not isinstance(tag, str):
        raise AuthError("unsigned entry: this store requires entries signed with its keys")
    why = keys.verify(tag, signed_bytes(meta))
    if why is not None:
        raise AuthError(f"entry not authenticated: {why}", retired=keys.is_retired(tag))
    try:
        digests = loads(meta["checksums"]).values()
    except (KeyError, ValueError, AttributeError):
        raise AuthError("signed entry without tensor digests") from None
    if not all(isinstance(d, str) and d.startswith(SHA256) for d in digests):
        raise AuthError("signed entry whose tensor digests are not SHA-256")
