"""create_blend_retrieval_chain: create_retrieval_chain that hands the Documents to the model."""

from __future__ import annotations

from typing import Any

from langchain_core.documents import Document
from langchain_core.output_parsers import BaseOutputParser, StrOutputParser
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough

from blendrag.integration.chunks import DEFAULT_SEPARATOR
from blendrag.langchain.chat import ChatBlend
from blendrag.langchain.llm import BlendLLM, format_documents, unbound


def create_blend_retrieval_chain(
    retriever: BaseRetriever | Runnable[dict, list[Document]],
    llm: BlendLLM | ChatBlend,
    prompt: BasePromptTemplate,
    *,
    document_separator: str = DEFAULT_SEPARATOR,
    document_variable_name: str = "context",
    output_parser: BaseOutputParser | None = None,
) -> Runnable[dict[str, Any], dict[str, Any]]:
    """Retrieval chain with the contract of ``create_retrieval_chain`` over
    ``create_stuff_documents_chain``: ``{"input": ...}`` in; ``input``, ``context`` (the
    Documents) and ``answer`` out.

    The retrieved documents are formatted with ``llm.document_prompt`` and joined with
    ``document_separator`` into ``prompt``'s ``document_variable_name`` variable, as the stuff
    chain does; the Documents themselves also go to ``llm`` (``documents=``), so the chunks are
    located without the text index. ``llm`` is a :class:`BlendLLM` or :class:`ChatBlend`.
    """
    if not isinstance(unbound(llm), (BlendLLM, ChatBlend)):
        raise TypeError(f"llm must be blendrag's LangChain BlendLLM or ChatBlend, got "
                        f"{type(llm).__module__}.{type(llm).__name__} (a plain LLM: "
                        f"langchain's create_retrieval_chain)")
    if document_variable_name not in prompt.input_variables:
        raise ValueError(f"prompt must have a {document_variable_name!r} variable, has "
                         f"{prompt.input_variables}")
    if not isinstance(retriever, BaseRetriever):
        retrieve: Runnable = retriever
    else:
        retrieve = RunnableLambda(lambda x: x["input"]) | retriever
    parser = output_parser or StrOutputParser()

    def stuff(inputs: dict[str, Any]) -> str:
        return document_separator.join(format_documents(inputs["context"], llm.document_prompt))

    def answer_chain(inputs: dict[str, Any]) -> Runnable:
        # A Runnable returned by a RunnableLambda runs on the same input, config and callbacks
        # (stream and astream included): this only binds the request's own Documents.
        model: Runnable = llm.bind(documents=inputs["context"])  # str or message out: parsed
        return (RunnablePassthrough.assign(**{document_variable_name: stuff}) | prompt | model
                | parser)

    return (
        RunnablePassthrough.assign(context=retrieve.with_config(run_name="retrieve_documents"))
        .assign(answer=RunnableLambda(answer_chain).with_config(run_name="blend_stuff_documents_chain"))
    ).with_config(run_name="blend_retrieval_chain")
