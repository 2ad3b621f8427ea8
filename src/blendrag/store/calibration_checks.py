"""What a calibration record's file must be before anything in it is used
(``calibration.py``): bytes read within bounds from a regular file, JSON of this format whose
checksum holds, a tag the store's keys verify (where it has keys), and each field of the
expected type and range. Every failure is a ValueError (OSError for the file) naming the
problem; the book turns it into a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import fields
from pathlib import Path

from blendrag.checks import check_at_least, check_count, is_finite_number
from blendrag.store.auth import StoreKeys

FORMAT = 1
MAX_BYTES = 1 << 20  # a record is a few KiB: a larger file is not one, and is not read whole
_SIGNED = b"blendrag-calibration-record\0"
TARGET_FIELDS = frozenset({"same_answer", "answer_kl", "answer_tokens", "first_sentence"})
QUALITY_KIND = "answer_quality"  # a target on answer quality against gold answers (--qa)
QUALITY_TARGET_FIELDS = frozenset({"kind", "margin", "confidence", "metric", "answer_tokens",
                                   "questions", "full_quality", "quality", "bound"})
QUALITY_METRICS = frozenset({"qa_f1", "rouge_l", "contains"})  # blendrag.eval.metrics.METRICS


def read_bounded(path: Path) -> bytes:
    """At most ``MAX_BYTES`` of the regular file ``path`` (never a link, a pipe or a device:
    reading one could block or never end); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise OSError(f"larger than {MAX_BYTES} bytes: not a calibration record")
    return data


def document(body: dict, keys: StoreKeys | None, ns_id: str, name: str) -> str:
    """The file of a record's fields ``body``: its format, its checksum and, with ``keys``,
    its tag over the namespace ``ns_id``, the file ``name`` and the content."""
    text = json.dumps(body, sort_keys=True)
    outer: dict[str, object] = {"format": FORMAT, "sha256": sha(text), "record": body}
    if keys is not None:
        outer["auth"] = keys.sign(signed_message(ns_id, name, text))
    return json.dumps(outer, sort_keys=True, indent=1)


def parse(text: str) -> dict:
    """The file's JSON with its format and checksum checked; ValueError otherwise."""
    try:
        outer = json.loads(text)
        body = outer["record"]
        if outer.get("format") != FORMAT or not isinstance(body, dict) or outer.get(
                "sha256") != sha(json.dumps(body, sort_keys=True)):
            raise ValueError("checksum or format mismatch")
        return outer
    except (KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise ValueError(f"not a calibration record ({type(exc).__name__}: {exc})") from None


def authenticate(outer: dict, keys: StoreKeys, ns_id: str, name: str) -> None:
    """ValueError unless the parsed file ``outer`` carries a tag ``keys`` verify over the
    namespace ``ns_id``, the file ``name`` and its content; checked before any field is read."""
    tag = outer.get("auth")
    if not isinstance(tag, str):
        raise ValueError("unsigned: this store's records must be signed with its keys")
    message = signed_message(ns_id, name, json.dumps(outer["record"], sort_keys=True))
    why = keys.verify(tag, message)
    if why is not None:
        raise ValueError(f"not authenticated: {why}")


def signed_message(ns_id: str, name: str, text: str) -> bytes:
    """What a record's tag covers: its namespace id (a record copied into another namespace
    does not verify), its file name (nor one renamed) and its content."""
    return b"\0".join((_SIGNED, ns_id.encode(), name.encode(), text.encode()))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---- fields ----------------------------------------------------------------------------

def check_fields(label: str, body: object, kind: type,
                 optional: frozenset[str] = frozenset()) -> None:
    """ValueError unless ``body`` is a dict of exactly the dataclass ``kind``'s fields (one
    left out would take its default: a date left out is not "now"), less any of ``optional``
    (fields added later whose default means "not measured": records written before them)."""
    names = {f.name for f in fields(kind)}
    if not isinstance(body, dict) or not names - optional <= set(body) <= names:
        have = sorted(map(str, body)) if isinstance(body, dict) else type(body).__name__
        raise ValueError(f"{label} must have the fields {sorted(names)}, got {have}")


def check_target(target: object) -> None:
    """A calibration target as a record keeps it: ``CalibrationTarget``'s fields, or the
    answer-quality target's (``kind`` "answer_quality": ``check_quality_target``)."""
    if isinstance(target, dict) and "kind" in target:
        check_quality_target(target)
        return
    if not isinstance(target, dict) or set(target) != TARGET_FIELDS:
        raise ValueError(f"CalibrationRecord.target must be a dict of {sorted(TARGET_FIELDS)}")
    same, kl = target["same_answer"], target["answer_kl"]
    if same is None and kl is None:
        raise ValueError("CalibrationRecord.target needs same_answer, answer_kl or both")
    if same is not None:
        check_fraction("CalibrationRecord.target same_answer", same)
    if kl is not None:
        check_at_least("CalibrationRecord.target answer_kl", kl)
    check_count("CalibrationRecord.target answer_tokens", target["answer_tokens"], 1)
    if not isinstance(target["first_sentence"], bool):
        raise ValueError("CalibrationRecord.target first_sentence must be a bool")


def check_quality_target(target: dict) -> None:
    """The answer-quality target (``blendrag.calibration.quality``) and what it measured: the
    margin and confidence asked, the metric, the answer length, the questions, full prefill's
    mean quality, and the chosen ratio's mean quality and the lower bound of its difference
    from full's (both None when no ratio met the target)."""
    label = "CalibrationRecord.target"
    if target.get("kind") != QUALITY_KIND or set(target) != QUALITY_TARGET_FIELDS:
        raise ValueError(f"{label} of kind {QUALITY_KIND!r} must be a dict of "
                         f"{sorted(QUALITY_TARGET_FIELDS)}")
    for name in ("margin", "full_quality"):
        check_fraction(f"{label} {name}", target[name])
    if not (is_finite_number(target["confidence"]) and 0.5 <= target["confidence"] < 1):
        raise ValueError(f"{label} confidence must be in [0.5, 1), got {target['confidence']!r}")
    if target["metric"] not in QUALITY_METRICS:
        raise ValueError(f"{label} metric must be one of {sorted(QUALITY_METRICS)}, got "
                         f"{str(target['metric'])[:40]!r}")
    check_count(f"{label} answer_tokens", target["answer_tokens"], 1)
    check_count(f"{label} questions", target["questions"], 1)
    quality, bound = target["quality"], target["bound"]
    if (quality is None) != (bound is None):
        raise ValueError(f"{label} quality and bound are both None (no ratio met the target) "
                         "or both numbers")
    if quality is not None:
        check_fraction(f"{label} quality", quality)
        check_difference(f"{label} bound", bound)


def check_difference(label: str, value: object) -> None:
    """A bound on a difference of two qualities in [0, 1]: finite and at most 1 (it may lie
    below -1, where few questions vary widely)."""
    if not (is_finite_number(value) and value <= 1):  # type: ignore[operator]
        raise ValueError(f"{label} must be a finite number <= 1, got {str(value)[:40]!r}")


def check_text(label: str, value: object, longest: int, empty: bool = False) -> None:
    if not isinstance(value, str) or len(value) > longest or (not value and not empty):
        raise ValueError(f"{label} must be a {'' if empty else 'non-empty '}string of at most "
                         f"{longest} characters, got {str(value)[:40]!r}")


def check_fraction(label: str, value: object) -> None:
    if not (is_finite_number(value) and 0 <= value <= 1):  # type: ignore[operator]
        raise ValueError(f"{label} must be a number in [0, 1], got {value!r}")


