"""Helpers shared by the tests (importable because ``tests/`` is on pytest's ``pythonpath``).

- ``tiny``: tiny random-weight models and a locally trained BPE tokenizer, plus a passage set;
- ``tiny_gguf``: a tiny Llama written as a GGUF file;
- ``kvgen``: deterministic chunk KVs and bitwise comparisons for store tests;
- ``procs`` / ``store_worker``: store operations in child processes;
- ``servers``: the local Redis / Redis Cluster / Ceph S3 servers, or the test skipped with the
  reason where this machine cannot start them;
- ``sources``: a persisted Chroma collection with explicit embeddings;
- ``lc_data`` / ``li_data``: the corpus and settings of the LangChain / LlamaIndex tests.
"""
