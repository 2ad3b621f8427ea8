"""What the LangChain and LlamaIndex integrations share, framework-neutral; each framework
module only translates its types and callbacks to these.

- ``client``: ``BlendClient``, the one object both frameworks' classes wrap: the engine, the
  text index, the chunk format, the fallback policy and the last request; a hook's ingestion
  and one request's start;
- ``settings``: the flat settings both LLMs expose (needs pydantic, as both frameworks do);
- ``chunks``: how retrieved chunks are written into a prompt (one chunk template, one separator);
- ``text_index`` / ``flat_prompt``: find ingested chunk texts in the flat prompt a chain built
  and turn it into a ``PromptLayout``;
- ``fallback``: a prompt without any known chunk (said once, counted, or refused);
- ``embedding``: local sentence-transformers embedders.
"""
