"""The request path: one prefill from open to the first token's logits, then decoding.

``prefill.py`` runs a request (open its rows: prefix-cache head, history, chunk entries; plan
what to load and compute; run the layer loop; logits), redone without an entry whose layer
failed to load; ``head.py`` decides which prefix-cache rows it starts from; ``generation.py``
decodes the answer as a token stream, choosing each next token; ``stats.py`` says what the
request did (where its time went: the phase clock, an observer of the layer loop). Nothing here
holds the engine: the facade (``engine.py``) hands each request what it needs.
"""
