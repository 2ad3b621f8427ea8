"""How a store names its entries: the namespace they belong to and a name that tells nothing.

A namespace (a tenant, or a tenant's user: any string the application or server sets, never
the request text) enters every stored name as its *namespace id*, so that two namespaces never
share an entry and each shared tier keeps each namespace under a physical prefix of its own
(``<prefix>:<ns_id>:`` in Redis, ``<prefix>/<ns_id>/`` in S3) that Redis ACLs and bucket
policies can be set on. The id is a keyed hash of the namespace with a deployment key
(``StoreKeys``), a plain one without: never the tenant's name.

With a deployment key the entry's own part of the name is keyed too (HMAC of the content key
under the naming key): someone who can list the store cannot test whether a passage is in it.
The default namespace without a key keeps today's names (the content key itself), so a store
written before namespaces existed reads the same.
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property

from blendrag.store.auth import StoreKeys

DEFAULT_NAMESPACE = ""
MAX_NAMESPACE = 256
NS_ID_CHARS = 16
PRINTABLE = frozenset({"L", "M", "N", "P", "S"})
"""Unicode major categories a namespace may use (letters, marks, numbers, punctuation,
symbols), and the space U+0020 (``Zs``): never a control (Cc: NUL, DEL, U+0085), format (Cf:
U+202E turns text around), surrogate (Cs: no UTF-8 for it), private-use (Co), unassigned (Cn),
line or paragraph separator (Zl, Zp) or another space (a name must read as it is stored)."""


@dataclass(frozen=True)
class Names:
    """The stored names of one namespace of a store."""

    namespace: str = DEFAULT_NAMESPACE
    keys: StoreKeys | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_namespace(self.namespace)

    @cached_property
    def ns_id(self) -> str:
        """The namespace's id in stored names: "" for the default namespace without a key."""
        if self.keys is not None:
            return self.keys.name("namespace", self.namespace)[:NS_ID_CHARS]
        if self.namespace == DEFAULT_NAMESPACE:
            return ""
        return hashlib.sha256(f"blendrag-namespace\0{self.namespace}".encode()).hexdigest()[
            :NS_ID_CHARS]

    def stored(self, key: str) -> str:
        """The name entry ``key`` (a content key) is stored under in this namespace."""
        ns_id = self.ns_id
        if not ns_id:
            return key
        digest = self.keys.name("entry", ns_id, key) if self.keys is not None else key
        return f"{ns_id}:{digest}"


class Named:
    """What a store shows of its ``names`` (both stores have one)."""

    names: Names

    @property
    def namespace(self) -> str:
        """The namespace this store reads and writes for ("" the default one)."""
        return self.names.namespace

    @property
    def namespace_id(self) -> str:
        """The namespace's id in stored names ("" for the default namespace without keys)."""
        return self.names.ns_id

    def stored_name(self, key: str) -> str:
        """The name the tiers hold ``key`` under in this store's namespace."""
        return self.names.stored(key)


def split(name: str) -> tuple[str, str]:
    """A stored name as (namespace id, the entry's own part); ("", name) in the default
    namespace without a key."""
    ns_id, sep, rest = name.partition(":")
    return (ns_id, rest) if sep else ("", name)


def check_namespace(namespace: object) -> str:
    """``namespace`` if it is a valid one: a string of at most ``MAX_NAMESPACE`` printable
    characters (``PRINTABLE``); else ValueError naming the problem (a bad character by its code
    point)."""
    if not isinstance(namespace, str):
        raise ValueError(f"a namespace is a string (a tenant, or tenant/user), got "
                         f"{type(namespace).__name__}")
    if len(namespace) > MAX_NAMESPACE:
        raise ValueError(f"a namespace is at most {MAX_NAMESPACE} printable characters, got "
                         f"{len(namespace)}")
    for i, c in enumerate(namespace):
        category = unicodedata.category(c)
        if category[0] not in PRINTABLE and c != " ":
            raise ValueError(f"a namespace is at most {MAX_NAMESPACE} printable characters: "
                             f"U+{ord(c):04X} at index {i} is not printable (category "
                             f"{category})")
    return namespace


def check_tenant_namespace(namespace: object, public_namespace: str | None) -> str:
    """``namespace`` if a tenant may have it: a valid namespace (``check_namespace``) that is
    not the store's ``public_namespace``, the corpus every tenant reads (a tenant there would
    write into it); else ValueError. The ingestion job writes that corpus through a store of
    its own (``store.namespaced(public_namespace)``), never as a tenant."""
    name = check_namespace(namespace)
    if public_namespace is not None and name == public_namespace:
        raise ValueError(f"namespace {namespace!r} is the store's public_namespace, which every "
                         "tenant reads: a tenant there would write into it; the ingestion job "
                         "writes it through store.namespaced(public_namespace), tenants get "
                         "namespaces of their own")
    return name
