"""LangChain's standard chat-model tests (langchain-tests) for ChatBlend: the unit suite and,
since the model runs locally and fast, the integration suite too (invoke, stream, batch and
their async forms, conversations, usage metadata, stop sequences, stream events).

Skipped there, each by the suite itself: tool calling, structured output and JSON mode (a
plain local completion engine has no tool protocol), image / audio / PDF inputs (text-only
models), serialization (ChatBlend holds a live engine), init from environment variables (no
API key), per-call model override (one engine, one model), VCR timing.

langchain-tests has no standard suite for completion LLMs (BaseLLM); BlendLLM's equivalents
(init with standard params, tracing params, stream/batch/async) are in test_lc_llm.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_tests")

from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402
from langchain_tests.unit_tests import ChatModelUnitTests  # noqa: E402

from blendrag.langchain import BlendLLM, ChatBlend  # noqa: E402


class _ChatBlendSuite:
    """What both standard suites need to build ChatBlend and which features it lacks."""

    chat_model_extra: dict = {}

    @pytest.fixture(autouse=True)
    def _engine(self, engine) -> None:
        # The standard suites read their constructor arguments from a property, not a fixture.
        self.engine = engine

    @property
    def chat_model_class(self) -> type[ChatBlend]:
        return ChatBlend

    @property
    def chat_model_params(self) -> dict:
        return {"engine": self.engine, **self.chat_model_extra}

    @property
    def has_tool_calling(self) -> bool:
        return False  # a local completion engine: no tool-calling protocol

    @property
    def has_structured_output(self) -> bool:
        return False


class TestChatBlendStandard(_ChatBlendSuite, ChatModelUnitTests):
    pass


# The suite's async tests are unmarked coroutines (it expects asyncio_mode=auto): the class mark
# runs them under pytest-asyncio; its warning about the sync tests the mark also reaches is noise.
@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:The test <Function:pytest.PytestWarning")
class TestChatBlendIntegration(_ChatBlendSuite, ChatModelIntegrationTests):
    chat_model_extra = {"max_tokens": 8}


def test_llm_accepts_the_standard_params(engine):
    """The constructor arguments the standard suite gives chat models, on BlendLLM."""
    llm = BlendLLM(engine=engine, temperature=0, max_tokens=100, timeout=60, stop=[], max_retries=2,
                   streaming=True)
    assert llm.max_tokens == 100 and llm.streaming
    ls = BlendLLM(engine=engine, max_tokens=10, stop=["test"])._get_ls_params(model="other-name")
    assert ls == {"ls_provider": "blendrag", "ls_model_type": "llm", "ls_model_name": "other-name",
                  "ls_temperature": 0.0, "ls_max_tokens": 10, "ls_stop": ["test"]}
