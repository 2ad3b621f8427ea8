"""The framework guides say what the code does: every default in the "Configuration" tables of
docs/langchain.md and docs/llamaindex.md is the class's real default, every field of the
classes is in its table, the per-call claims match the keyword arguments a call honours, and
each guide opens with a runnable quick start (run by tests/test_readme.py, marked slow)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.language_models import BaseChatModel, BaseLLM  # noqa: E402
from llama_index.core.llms.custom import CustomLLM  # noqa: E402

import blendrag.langchain as lc  # noqa: E402
import blendrag.llamaindex as li  # noqa: E402
from blendrag.integration.settings import CALL_KEYS, BlendSettings  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"
_LITERALS = re.compile(r"`[^`]*`(, `[^`]*`)*")

# What each guide's table documents: the class, and the framework base class whose own fields
# (LangChain's cache, verbose, callbacks, tags, metadata, rate_limiter, ...; LlamaIndex's
# callback_manager, system_prompt, messages_to_prompt, ...) the framework documents, not us.
CLASSES = {
    "langchain.md": [(lc.BlendLLM, BaseLLM), (lc.ChatBlend, BaseChatModel)],
    "llamaindex.md": [(li.BlendLLM, CustomLLM)],
}
# Fields of ours that a table may leave out, each with the reason. None today.
EXCLUDED: dict[str, str] = {}
# Rows whose default is prose, not a literal: only the row's existence is checked.
# text_index: the class default is None, resolved at construction to <disk tier>/text_index or
# a new in-memory index (integration/client.py: default_text_index), which a literal cannot say.
PROSE = {"text_index"}


def section(doc: str, heading: str) -> str:
    text = (DOCS / doc).read_text()
    assert f"\n## {heading}\n" in text, f"{doc} has no '## {heading}' section"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table(doc: str) -> dict[str, str]:
    """field -> its documented default (a literal's source, "required", or prose), one entry per
    field of the Configuration table (a row may name several fields and as many literals)."""
    rows = [line for line in section(doc, "Configuration").splitlines() if line.startswith("|")]
    assert [c.strip() for c in rows[0].strip("|").split("|")][:2] == ["field", "default"]
    out: dict[str, str] = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        assert len(cells) == 3, row
        names = re.findall(r"`(\w+)`", cells[0])
        assert names and ", ".join(f"`{n}`" for n in names) == cells[0], row
        if _LITERALS.fullmatch(cells[1]):
            defaults = re.findall(r"`([^`]*)`", cells[1])
            assert len(defaults) == len(names), f"{doc}: {row}: one default per field"
        else:
            defaults = [cells[1]] * len(names)  # "required" or prose, for every field named
        for name, default in zip(names, defaults):
            assert name not in out, f"{doc}: {name} documented twice"
            out[name] = default
    return out


def own_fields(cls, base) -> set[str]:
    """The class's fields that its framework base class does not define, the shared settings
    always included (so that a base class growing a field of the same name hides none)."""
    return (set(cls.model_fields) - set(base.model_fields)) | set(BlendSettings.model_fields)


def init_params(cls) -> dict[str, inspect.Parameter]:
    """Constructor arguments that are not fields (LlamaIndex's ``engine``, ``text_index``)."""
    params = inspect.signature(cls.__init__).parameters
    return {n: p for n, p in params.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


@pytest.mark.parametrize("doc", sorted(CLASSES))
def test_every_documented_default_is_the_real_one(doc: str) -> None:
    documented = table(doc)
    for cls, _ in CLASSES[doc]:
        for name, default in documented.items():
            where = f"{doc}: {cls.__module__}.{cls.__name__}.{name}"
            if name in cls.model_fields:
                field = cls.model_fields[name]
                if default == "required":
                    assert field.is_required(), f"{where} is documented as required"
                elif name in PROSE:
                    assert not field.is_required(), f"{where} is documented with a default"
                else:
                    value = ast.literal_eval(default)
                    assert not field.is_required(), f"{where} is required, documented {default}"
                    assert repr(value) == repr(field.default), \
                        f"{where}: documented {default}, the class says {field.default!r}"
            else:  # a constructor argument, not a field
                params = init_params(cls)
                assert name in params, f"{where} is documented but is no field or argument"
                param = params[name]
                if default == "required":
                    assert param.default is param.empty, f"{where} is documented as required"
                elif name in PROSE:
                    assert param.default is None, f"{where}: None (resolved at construction)"
                else:
                    assert repr(ast.literal_eval(default)) == repr(param.default), \
                        f"{where}: documented {default}, the signature says {param.default!r}"


@pytest.mark.parametrize("doc", sorted(CLASSES))
def test_every_field_is_documented(doc: str) -> None:
    documented = set(table(doc))
    for cls, base in CLASSES[doc]:
        missing = own_fields(cls, base) - documented - set(EXCLUDED)
        assert not missing, f"{doc} does not document {cls.__name__}'s fields {sorted(missing)}"


def test_the_shared_settings_have_one_set_of_defaults() -> None:
    # langchain.md says so, and llamaindex.md points to it
    for name in BlendSettings.model_fields:
        defaults = {repr(cls.model_fields[name].default)
                    for cls in (lc.BlendLLM, lc.ChatBlend, li.BlendLLM)}
        assert len(defaults) == 1, (name, defaults)


@pytest.mark.parametrize("doc", sorted(CLASSES))
def test_the_per_call_exceptions_are_those_a_call_ignores(doc: str) -> None:
    intro = section(doc, "Configuration").split("\n|", 1)[0]
    match = re.search(r"except ((?:`\w+`(?:,\s+|\s+and\s+)?)+)", intro)
    assert match, f"{doc}'s Configuration section does not say which fields a call cannot set"
    documented = set(re.findall(r"`(\w+)`", match.group(1)))
    cls, base = CLASSES[doc][0]
    fields = own_fields(cls, base) | set(init_params(cls))
    per_call = set(CALL_KEYS) - {"blend_config", "generation_config"}
    assert documented == fields - per_call, \
        f"{doc}: a call cannot set {sorted(fields - per_call)}; documented {sorted(documented)}"


@pytest.mark.parametrize("doc", sorted(CLASSES))
def test_each_guide_opens_with_a_runnable_quick_start(doc: str) -> None:
    text = (DOCS / doc).read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Quick start", f"{doc}: the quick start comes first"
    quick = section(doc, "Quick start")
    assert "<!-- runnable -->\n```python\n" in quick
    block = quick.split("<!-- runnable -->\n```python\n", 1)[1].split("\n```", 1)[0]
    assert '"smollm2-135m-instruct"' in block and "real_corpus" in block
    splitter = "RecursiveCharacterTextSplitter" if doc == "langchain.md" else "SentenceSplitter"
    assert splitter in block and "same answer as full prefill" in block
    assert len(block.splitlines()) < 60
