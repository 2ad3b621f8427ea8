"""Hostile and damaged entry bytes for the store's fuzz and tamper tests: each ``mutate`` call
returns the bytes of a real entry changed the way a damaged disk or someone with write access
to a tier could change them (truncated, bytes flipped, a header spliced from another entry,
numbers grown past anything a tensor has, nesting deep enough to exhaust a recursive parser,
the header length swapped, the signature stripped), and ``HOSTILE_HEADERS`` the values of
findings that once failed requests."""

from __future__ import annotations

import json
import random
import re

DEEP = 100_000  # nesting that exhausts a recursive parser's stack
# Values no tensor can have, as JSON text (what json.dumps cannot write but a file can hold).
HUGE_NUMBERS = ["1e999", "-1e999", "Infinity", "-Infinity", "NaN", str(10**40), str(2**64),
                "-1", "1.5", "1" + "0" * 5000, "true", '"3"', "null"]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def split(data: bytes) -> tuple[bytes, bytes]:
    """(header bytes, payload) of an encoded entry."""
    n = int.from_bytes(data[:8], "little")
    return data[8:8 + n], data[8 + n:]


def join(header: bytes, payload: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header + payload


def hostile_header(data: bytes, where: str, value: str) -> bytes:
    """``data`` with ``value`` (JSON text) in place of the first tensor's ``where``
    ("data_offsets" or "shape") first number, or of the metadata's JSON text ``where``
    ("meta:shape", "meta:token_ids"), or deep nesting ("deep": in the header itself)."""
    header, payload = split(data)
    text = header.decode()
    if where == "deep":
        text = text[:-1].rstrip() + ',"x":' + "[" * DEEP + "]" * DEEP + "}"
    elif where.startswith("meta:"):
        field = where[5:]
        parsed = json.loads(text)
        inner = parsed["__metadata__"][field]
        parsed["__metadata__"][field] = ("[" * DEEP + "]" * DEEP if value == "deep"
                                         else re.sub(r"-?\d+", value, inner, count=1))
        text = json.dumps(parsed)
    else:
        at = text.index(f'"{where}":[') + len(where) + 4
        end = re.match(r"-?\d+", text[at:])
        assert end is not None
        text = text[:at] + value + text[at + end.end():]
    return join(text.encode(), payload)


def mutate(data: bytes, rng: random.Random, others: list[bytes]) -> bytes:
    """One random mutation of entry ``data`` (``others``: real entries to splice from)."""
    kind = rng.randrange(9)
    header, payload = split(data)
    if kind == 0:  # truncated anywhere
        return data[:rng.randrange(len(data))]
    if kind == 1:  # a few bytes flipped anywhere
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if kind == 2:  # a byte flipped in the header
        out = bytearray(header)
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return join(bytes(out), payload)
    if kind == 3:  # another entry's header over this payload (or the reverse)
        other_header, other_payload = split(rng.choice(others))
        return (join(other_header, payload) if rng.random() < 0.5
                else join(header, other_payload))
    if kind == 4:  # a number in the header grown past anything a tensor has
        spots = list(_NUMBER.finditer(header))
        spot = rng.choice(spots)
        value = rng.choice(HUGE_NUMBERS).encode()
        return join(header[:spot.start()] + value + header[spot.end():], payload)
    if kind == 5:  # nested deeply, in the header or where a metadata string is
        at = rng.randrange(1, len(header))
        depth = rng.choice([9, 100, DEEP])
        return join(header[:at] + b"[" * depth + b"]" * depth + header[at:], payload)
    if kind == 6:  # the header length swapped for another
        n = rng.choice([0, 1, len(header) - 1, len(header) + 1, len(data), 2**63, 2**64 - 1,
                        rng.randrange(2**64)])
        return n.to_bytes(8, "little") + data[8:]
    if kind == 7:  # the signature (or anything after it) stripped from the header
        text = header.replace(b'"header_tag":', b'"header_taf":')
        return join(text, payload)
    # kind 8: a valid JSON header of another shape: a tensor's numbers rewritten
    parsed = json.loads(header)
    name = rng.choice([k for k in parsed if k != "__metadata__"])
    spec = parsed[name]
    field = rng.choice(["shape", "data_offsets"])
    if spec[field]:
        spec[field][rng.randrange(len(spec[field]))] = rng.choice([0, 1, -1, 10**12, 2**62])
    return join(json.dumps(parsed).encode(), payload)
