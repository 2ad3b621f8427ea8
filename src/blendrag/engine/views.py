"""Namespace views: one engine serving many namespaces (tenants, or tenant/user), each view the
same model, store tiers and settings over its own namespace's entries and caches
(``BlendEngine.namespaced``). This file keeps the views: which one serves a namespace, how
long an unused one lives, and every view re-pointed together when the engine's store is
replaced. How a view is made is the engine's (``BlendEngine._view``)."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from blendrag.store.names import check_tenant_namespace
from blendrag.store.protocol import KVStore

MAX_VIEWS = 64
"""Namespace views an engine keeps for reuse, the most recently asked for; an older one lives
on only while its caller holds it (views are cheap: the caches' budgets are the engine's)."""

E = TypeVar("E")


def _public(store: KVStore) -> str | None:
    """The namespace every tenant reads (a ``TieredKVStore``'s shared corpus), if any."""
    return getattr(getattr(store, "public", None), "namespace", None)


class NamespaceViews(Generic[E]):
    """Namespace -> the engine serving it, while someone holds it or among the ``keep`` most
    recently asked for; one instance shared by an engine and all its views (thread-safe)."""

    def __init__(self, keep: int = MAX_VIEWS) -> None:
        self.keep = keep
        self._held: weakref.WeakValueDictionary[str, E] = weakref.WeakValueDictionary()
        self._recent: OrderedDict[str, E] = OrderedDict()  # the ``keep`` kept alive
        self._lock = threading.Lock()

    def get(self, home: E, store: KVStore, namespace: str, make: Callable[[str], E]) -> E:
        """The view serving ``namespace``: ``home`` (serving ``store``) for its own, the one
        held or kept, else ``make(namespace)``. ValueError for ``store``'s public namespace."""
        with self._lock:
            self._held.setdefault(store.namespace, home)
            view = self._held.get(namespace)
            if view is None:
                check_tenant_namespace(namespace, _public(store))
                view = make(namespace)
                self._held[namespace] = view
            self._recent[namespace] = view
            self._recent.move_to_end(namespace)
            while len(self._recent) > self.keep:
                self._recent.popitem(last=False)
        return view

    def repoint(self, home: E, store: KVStore, point: Callable[[E, KVStore], None]) -> None:
        """``point`` ``home`` at ``store`` and every other view alive at its namespace of
        ``store``; ValueError, nothing changed, when one of them is ``store``'s public
        namespace."""
        with self._lock:
            views = [(ns, v) for ns, v in self._held.items() if v is not home]
            public = _public(store)
            for ns, _ in views:
                check_tenant_namespace(ns, public)
            for ns in [ns for ns, v in self._held.items() if v is home]:
                del self._held[ns]  # home's namespace may change with the store
            point(home, store)
            for ns, view in views:
                point(view, store.namespaced(ns))
            if views:
                self._held[store.namespace] = home
