"""Caches: rows kept beyond the request that computed them.

``chunk_cache.py`` is the one part of the engine that touches the store: it opens each chunk's
stored entry for layer-wise reads, and computes and stores the misses, after the ingestion
context (``context.py``) and with their context-sensitivity profiles (``profile.py``).
``prefix_cache.py`` keeps finished requests' rows by block for a later request that begins the
same way; ``history.py`` keeps the rows after each request's last chunk (the conversation) to
blend like a chunk wherever a later prompt's suffix begins with them.
"""
