"""Pieces are tokenized separately; chat templates wrap them without touching chunk tokens."""

from __future__ import annotations

import pytest

from blendrag import PromptBuilder, PromptLayout
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


@pytest.fixture
def tok(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_pieces_are_tokenized_separately(tok):
    layout = PromptBuilder(tok, chat=False).build(PREFIX, PASSAGES, SUFFIX)
    assert layout.prefix_ids[0] == tok.bos_token_id
    for ids, text in zip(layout.chunk_ids, PASSAGES):
        assert list(ids) == tok(text, add_special_tokens=False)["input_ids"]
    assert layout.ids == list(layout.prefix_ids) + [t for c in layout.chunk_ids for t in c] + list(
        layout.suffix_ids
    )
    assert [e - s for s, e in layout.chunk_spans] == [len(c) for c in layout.chunk_ids]


def test_joined_string_would_tokenize_differently(tok):
    """Why pieces are separate: merges cross boundaries in the joined string
    (docs/architecture.md)."""
    pieces = ["the quick bro", "wn fox jumps"]
    joined = tok("".join(pieces), add_special_tokens=False)["input_ids"]
    separate = sum((tok(p, add_special_tokens=False)["input_ids"] for p in pieces), [])
    assert joined != separate


def test_chunk_tokens_do_not_depend_on_neighbours_or_template(tok):
    plain = PromptBuilder(tok, chat=False).build(PREFIX, PASSAGES, SUFFIX)
    chat = PromptBuilder(tok, chat=True, system="Be brief.").build(
        "Other prefix: ", PASSAGES[::-1], SUFFIX
    )
    assert set(plain.chunk_ids) == set(chat.chunk_ids)
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Other prefix: " + "".join(PASSAGES[::-1]) + SUFFIX}],
        tokenize=False, add_generation_prompt=True)
    assert (
        PromptBuilder(tok, chat=True, system="Be brief.").render(
            "Other prefix: ", PASSAGES[::-1], SUFFIX
        )
        == rendered
    )
    assert tok.decode(chat.prefix_ids).startswith("<s><|system|>\nBe brief.")
    assert tok.decode(chat.suffix_ids).endswith("<|assistant|>\n")
    assert chat.prefix_ids.count(tok.bos_token_id) == 1  # the template's BOS, not a second one


@pytest.mark.parametrize("chunks, message", [
    ([], "at least one chunk"),
    (["ok", ""], "chunk 1 is empty"),
    ("a string", "sequence of strings"),
])
def test_bad_chunks_raise(tok, chunks, message):
    with pytest.raises(ValueError, match=message):
        PromptBuilder(tok, chat=False).build(PREFIX, chunks, SUFFIX)


def test_layout_validation():
    with pytest.raises(ValueError, match="at least one chunk"):
        PromptLayout((1,), (), (5,))
    with pytest.raises(ValueError, match="chunk 0 is empty"):
        PromptLayout((1,), ((),), (5,))
    with pytest.raises(ValueError, match="suffix is empty"):
        PromptLayout((1,), ((3, 4),), ())


def test_chat_requested_without_template_raises(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        PromptBuilder(tok, chat=True)


# Llama 3.2's way: today's date unless the caller gives date_string
DATED = ("{{ bos_token }}{%- if not date_string is defined %}{%- set date_string = "
         "strftime_now('%d %b %Y') %}{%- endif %}<|system|>Today Date: {{ date_string }}\n"
         "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_a_template_that_prints_the_date_renders_the_same_every_day(tokenizer_dir, monkeypatch,
                                                                   caplog):
    """The template's head is part of every stored chunk's key: rendered with a fixed
    ``date_string``, a chunk stored today is found tomorrow; a template that prints the date
    and takes no date_string is warned about."""
    import datetime

    import transformers.utils.chat_template_utils as templates
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = DATED
    heads = []
    for day in (datetime.datetime(2025, 3, 1, 23), datetime.datetime(2025, 3, 2, 0, 5)):
        class Today(datetime.datetime):
            @classmethod
            def now(cls, tz=None, day=day):
                return day

        monkeypatch.setattr(templates, "datetime", Today)
        builder = PromptBuilder(tok, chat=True, chunk_prefix="")
        heads.append(builder.chunk_prefix_ids())
        assert "Today Date: 26 Jul 2024" in builder.render_chat([{"role": "user", "content": "q"}])
    assert heads[0] == heads[1]
    tok.chat_template = DATED.replace("date_string", "today")  # prints it, takes no date_string
    with caplog.at_level("WARNING", logger="blendrag.prompt"):
        PromptBuilder(tok, chat=True)
    assert any("prints today's date" in r.getMessage() for r in caplog.records)
