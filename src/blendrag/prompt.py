"""Prompt layout: [prefix][chunk 1]...[chunk n][suffix], each piece tokenized on its own.

Tokenizing the joined string and searching for chunk boundaries breaks as soon as a merge
crosses a boundary (docs/architecture.md, "Exactness rules"), so every piece is tokenized
separately and the ids are concatenated. All modes, the full-prefill baseline included, run
on these very ids.

With a chat template, the template is rendered around a sentinel user message and split at
the sentinel: its head joins the prefix and its tail (incl. the assistant header) joins the
suffix, so a chunk's tokens are the same whatever surrounds it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

_SENTINEL = "\u2063BLENDRAG_USER_CONTENT\u2063"
TEMPLATE_DATE = "26 Jul 2024"
"""The ``date_string`` chat templates are rendered with: Llama 3.x's templates print today's
date (``strftime_now``) unless given one, and the template's head is part of every stored
chunk's key (the ids a chunk is computed after), which must not change at midnight. (Their own
fallback date.) A model that must know the date is told in the system message."""


PASSAGE_START = "The"
"""Text a passage typically begins with: what a prompt's first piece is tokenized before
(``PromptBuilder.prefix_ids``)."""
PREFIXES_KEPT = 16  # prefix texts whose ids a builder keeps


@dataclass(frozen=True, init=False)
class PromptLayout:
    """Token ids of one request, piece by piece.

    ``chunk_prefix_ids``: the chunk prefix, the ids the chunk KVs are computed after (part of
    their store key); not given: the request's own ``prefix_ids``.
    """

    prefix_ids: tuple[int, ...]
    chunk_ids: tuple[tuple[int, ...], ...]
    suffix_ids: tuple[int, ...]
    chunk_prefix_ids: tuple[int, ...]

    def __init__(self, prefix_ids: Sequence[int], chunk_ids: Sequence[Sequence[int]],
                 suffix_ids: Sequence[int], chunk_prefix_ids: Sequence[int] | None = None) -> None:
        prefix = _token_ids(prefix_ids)
        chunk_prefix = prefix if chunk_prefix_ids is None else _token_ids(chunk_prefix_ids)
        object.__setattr__(self, "prefix_ids", prefix)
        object.__setattr__(self, "chunk_ids", tuple(_token_ids(c) for c in chunk_ids))
        object.__setattr__(self, "suffix_ids", _token_ids(suffix_ids))
        object.__setattr__(self, "chunk_prefix_ids", chunk_prefix)
        if not self.chunk_ids:
            raise ValueError("a prompt needs at least one chunk (got none)")
        for i, c in enumerate(self.chunk_ids):
            if not c:
                raise ValueError(f"chunk {i} is empty (0 tokens); drop it or give it text")
        if not self.suffix_ids:
            raise ValueError("the suffix is empty: the prompt must end with computed tokens "
                             "(question / answer cue)")

    @property
    def ids(self) -> list[int]:
        out = list(self.prefix_ids)
        for c in self.chunk_ids:
            out.extend(c)
        out.extend(self.suffix_ids)
        return out

    @property
    def num_tokens(self) -> int:
        return len(self.prefix_ids) + sum(len(c) for c in self.chunk_ids) + len(self.suffix_ids)

    @property
    def chunk_spans(self) -> list[tuple[int, int]]:
        """[start, end) positions of each chunk in the full prompt."""
        spans, pos = [], len(self.prefix_ids)
        for c in self.chunk_ids:
            spans.append((pos, pos + len(c)))
            pos += len(c)
        return spans

    @property
    def suffix_start(self) -> int:
        return self.num_tokens - len(self.suffix_ids)


class PromptBuilder:
    """Turns text pieces into a :class:`PromptLayout` with one tokenizer.

    ``chat``: wrap the user content (prefix + chunks + suffix) in the tokenizer's chat template
    (with an optional ``system`` message); None = use it when the tokenizer has one.
    ``chunk_prefix``: the chunk prefix, text (after the template head) that chunk KVs are computed
    after, whatever the request's own prefix. None: each request's own prefix (exact for a fixed
    prompt). A canonical one lets ingestion precompute chunks before the prompts that will use
    them are known (framework chains); the request prefix's KV stays exact either way.
    """

    def __init__(self, tokenizer, chat: bool | None = None, system: str | None = None,
                 chunk_prefix: str | None = None) -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat and not has_template:
            raise ValueError("chat=True but the tokenizer has no chat_template")
        self.tokenizer = tokenizer
        self.chat = has_template if chat is None else chat
        self.system = system
        self.chunk_prefix = chunk_prefix
        self._head, self._tail = self._template_parts() if self.chat else ("", "")
        # ``prefix_ids`` of the texts last asked for (the chunk prefix, prompt prefixes), and
        # the ids of ``PASSAGE_START`` alone
        self._prefixes: dict[str, tuple[int, ...]] = {}
        self._start: tuple[int, ...] | None = None

    def _template_parts(self) -> tuple[str, str]:
        template = str(getattr(self.tokenizer, "chat_template", "") or "")
        if "strftime_now" in template and "date_string" not in template:
            log.warning("this chat template prints today's date (strftime_now) and takes no "
                        "date_string: the chunk KVs stored today (keyed by the ids they follow, "
                        "the template's head among them) will miss from tomorrow; give the "
                        "tokenizer a template without the date")
        messages = [{"role": "user", "content": _SENTINEL}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        rendered = self.render_chat(messages)
        if rendered.count(_SENTINEL) != 1:
            raise ValueError("the chat template does not render the user content exactly once")
        head, tail = rendered.split(_SENTINEL)
        return head, tail

    def render_chat(self, turns: list[dict[str, str]]) -> str:
        """``turns`` (``{"role", "content"}``) through the chat template, the assistant header
        last, a date it prints being ``TEMPLATE_DATE``."""
        return self.tokenizer.apply_chat_template(turns, tokenize=False,
                                                  add_generation_prompt=True,
                                                  date_string=TEMPLATE_DATE)

    def encode(self, text: str, first: bool = False) -> list[int]:
        """Ids of one piece. ``first``: the piece that starts the prompt, which gets the
        tokenizer's own specials (BOS) unless a chat template is used: a rendered template
        already spells its specials out as text."""
        _check_text(text)
        specials = first and not self.chat
        return list(self.tokenizer(text, add_special_tokens=specials)["input_ids"])

    def encode_cut(self, pieces: Sequence[str], first: bool = False) -> list[list[int]] | None:
        """The ids of ``"".join(pieces)`` tokenized as one string, cut where each piece ends: a
        token that spans a cut (a merge across it: " The" after "Context:") goes to the piece
        before it, so the pieces' ids joined are exactly the whole string's, as a plain LLM
        would run them. ``first``: as :meth:`encode`. None where the tokenizer gives no
        character offsets (a slow tokenizer)."""
        text = "".join(pieces)
        _check_text(text)
        try:
            enc = self.tokenizer(text, add_special_tokens=first and not self.chat,
                                 return_offsets_mapping=True)
        except (NotImplementedError, ValueError):  # no offsets from this tokenizer
            return None
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        lead = 0  # specials the tokenizer adds first (BOS: no characters) stay in the first piece
        while lead < len(offsets) and tuple(offsets[lead]) == (0, 0) and text:
            lead += 1
        out, start, end, i = [], 0, 0, lead
        for piece in pieces[:-1]:
            end += len(piece)
            while i < len(ids) and offsets[i][0] < end:
                i += 1
            out.append(ids[start:i])
            start = i
        out.append(ids[start:])
        return out

    @property
    def template_parts(self) -> tuple[str, str]:
        """(head, tail) of the chat template around the user content; ("", "") without one."""
        return self._head, self._tail

    def build(self, prefix: str, chunks: Sequence[str], suffix: str,
              templated: bool = False) -> PromptLayout:
        """Layout of ``prefix + chunks + suffix``, with the chat template around them when the
        builder uses one, unless ``templated`` (the text already spells the template)."""
        if isinstance(chunks, str):
            raise ValueError("chunks must be a sequence of strings, not one string")
        for i, c in enumerate(chunks):
            if not isinstance(c, str) or not c:
                raise ValueError(f"chunk {i} is empty or not a string: {c!r}")
        head, tail = ("", "") if templated else (self._head, self._tail)
        return PromptLayout(
            prefix_ids=self.prefix_ids(head + prefix),
            chunk_ids=[self.encode(c) for c in chunks],
            suffix_ids=self.encode(suffix + tail),
            chunk_prefix_ids=None if self.chunk_prefix is None else self.chunk_prefix_ids(),
        )

    def whole(self, text: str, templated: bool = False) -> PromptLayout:
        """``text`` tokenized as one string, for a plain full prefill of a prompt without
        known chunks. A layout needs a chunk and a suffix: the last token is the suffix, the
        rest one chunk (a full prefill does not depend on where pieces are cut)."""
        rendered = text if templated else self._head + text + self._tail
        # a rendered template spells its specials (BOS) out: none added to it
        ids = self.encode(rendered, first=not templated)
        if len(ids) < 2:
            raise ValueError(f"the prompt is too short to run ({len(ids)} token(s)): {text!r}")
        return PromptLayout((), (tuple(ids[:-1]),), tuple(ids[-1:]))

    def chunk_prefix_ids(self, prefix: str | None = None) -> list[int]:
        """Ids of the chunk prefix, which chunk KVs are computed after: ``chunk_prefix``, else the
        prompt prefix ``prefix``."""
        text = self.chunk_prefix if self.chunk_prefix is not None else prefix
        if text is None:
            raise ValueError("no chunk prefix: pass the prompt prefix or set "
                             "PromptBuilder(chunk_prefix=...)")
        return self.prefix_ids(self._head + text)

    def prefix_ids(self, text: str) -> list[int]:
        """Ids of a prompt's first piece as it is tokenized before a passage: a prompt
        tokenized as one string (a framework's flat prompt) cuts them so, and its chunks'
        stored KVs must follow those very ids (SmolLM2 tokenizes a blank line alone as one
        token, before text as two). Each piece on its own where the tokenizer gives no
        character offsets, or where a token spans the cut (a prefix ending in a space: no
        passage's stored KV can follow what the prompt then holds)."""
        known = self._prefixes.get(text)
        if known is None:  # tokenizing twice more than a piece: once per text, not per request
            cut = self.encode_cut([text, PASSAGE_START], first=True)
            if self._start is None:
                self._start = tuple(self.encode(PASSAGE_START))
            known = tuple(self.encode(text, first=True)
                          if cut is None or tuple(cut[1]) != self._start else cut[0])
            if len(self._prefixes) >= PREFIXES_KEPT:  # many prompt prefixes: start afresh
                self._prefixes = {}  # (a new dict: a request on another thread reads the old)
            self._prefixes[text] = known
        return list(known)

    def render(self, prefix: str, chunks: Sequence[str], suffix: str) -> str:
        """The prompt as one string (for display and for plain-text baselines)."""
        return self._head + prefix + "".join(chunks) + suffix + self._tail


def _token_ids(ids: Sequence[int]) -> tuple[int, ...]:
    """``ids`` as ints; ValueError for a negative id or a bool (``True`` is not token 1).
    The engine checks them against its model's vocabulary (``BlendEngine.check_length``)."""
    out = tuple(map(int, ids))  # both passes in C: every layout of every request comes here
    if (out and min(out) < 0) or bool in set(map(type, ids)):
        raise ValueError(f"token ids must be integers >= 0, got {[t for t in ids][:8]!r}...")
    return out


def _check_text(text: object) -> None:
    """ValueError unless ``text`` is a str of valid Unicode (the tokenizers library raises a
    TypeError on a lone surrogate)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text is not valid Unicode: {exc.reason} at character "
                         f"{exc.start}") from None
