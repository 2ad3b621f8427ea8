"""Per-call keyword arguments of the LlamaIndex LLM: ``stop=`` and ``strict=`` act on the call,
and one it does not know is said, not dropped in silence."""

from __future__ import annotations

import logging

import pytest

from blendrag.config import GenerationConfig
from blendrag.integration.fallback import NoChunkFoundError


def test_a_per_call_stop_stops_like_the_generation_configs(make_llm):
    llm = make_llm(max_tokens=24, temperature=0.0)
    plain = llm.complete("Tell me a story about a fox.").text
    assert len(plain) > 2
    stop = plain[1:3]  # a string the unstopped answer holds
    by_config = llm.complete("Tell me a story about a fox.",
                             generation_config=GenerationConfig(stop=(stop,))).text
    by_kwarg = llm.complete("Tell me a story about a fox.", stop=[stop]).text
    assert by_kwarg == by_config and stop not in by_kwarg and len(by_kwarg) < len(plain)


def test_a_per_call_strict_raises(make_llm):
    llm = make_llm()
    with pytest.raises(NoChunkFoundError):
        llm.complete("A prompt with no known chunk in it.", strict=True)
    with pytest.raises(ValueError, match="strict must be True or False"):
        llm.complete("A prompt with no known chunk in it.", strict="yes")


def test_an_unknown_keyword_is_said(make_llm, caplog):
    llm = make_llm(max_tokens=2)
    with caplog.at_level(logging.WARNING):
        llm.complete("Hello.", max_new_token=3)
    assert any("ignores unknown keyword arguments ['max_new_token']" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("nodes", ["a passage", 123, [123]], ids=["str", "int", "list-of-int"])
def test_nodes_that_are_not_a_list_of_nodes_or_texts_are_refused_by_name(make_llm, nodes):
    """A single string would be split into characters (every one a 'chunk'); anything that is
    no node raised AttributeError deep inside."""
    llm = make_llm()
    with pytest.raises(TypeError, match="nodes= takes"):
        llm.complete("Context: a passage\nQuestion: ?\nAnswer:", nodes=nodes)
