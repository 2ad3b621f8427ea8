"""What the LangChain and LlamaIndex integrations share, framework-neutral; each framework
module only translates its types and callbacks to these.

- ``chunks``: how retrieved chunks are written into a prompt (one chunk template, one separator);
- ``text_index`` / ``flat_prompt``: find ingested chunk texts in the flat prompt a chain built
  and turn it into a ``PromptLayout``;
- ``requests``: one request: the layout, the engine's stream (a full prefill when no chunk is
  found), chat rendering with the engine's system message, what the request did;
- ``fields``: the flat settings both LLMs expose (needs pydantic, as both frameworks do);
- ``ingestion``: a framework hook's ingestion (texts recorded, the one ingestion path,
  separators);
- ``embedding``: local sentence-transformers embedders.
"""
