"""Compute: running the model over a request's rows, exactly.

``runner.py`` owns the model, its adapter, the buffer pool, RoPE tables and decoding steps;
``loop.py`` is the one layer loop every mode runs (``layer.py``: one layer's projections,
attention and MLP; ``attention.py``: the kernels and masks; ``softcap.py``: Gemma 2's capped
attention); ``fused_kv.py`` is the request KV (cached rows with computed ones written in) and
``layer_feed.py`` places cached rows into it layer by layer, now or ahead; ``observers.py``
watch a run without steering it (counts, captured rows, attention, the phase clock);
``decode.py`` runs a decoding step, eager or from a CUDA graph; ``threads.py`` scopes torch's
CPU threads to the engine's calls.
"""
