"""Read a JSON object's top level one member at a time, and the elements of one array member one at a time, so a
trace of millions of events is never held as one parsed document (memory: one event and a read buffer).

    for key, value in members(fh, stream="traceEvents"):   # value is an iterator for the streamed key
"""
from __future__ import annotations

import json
from typing import IO, Iterator

CHUNK_CHARS = 1 << 20
_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


class JSONStreamError(ValueError):
    """The text is not the JSON object expected (or ends early); the message says where."""


class _Buffer:
    def __init__(self, fh: IO[str]):
        self.fh = fh
        self.text = ""
        self.pos = 0
        self.consumed = 0  # characters dropped from the front (for error offsets)
        self.eof = False

    def fill(self) -> bool:
        """Read more text; False at the end of the file."""
        if self.eof:
            return False
        chunk = self.fh.read(CHUNK_CHARS)
        if not chunk:
            self.eof = True
            return False
        if self.pos > CHUNK_CHARS:  # drop what was parsed, so the buffer stays about one chunk
            self.consumed += self.pos
            self.text = self.text[self.pos:]
            self.pos = 0
        self.text += chunk
        return True

    def skip_ws(self) -> str:
        """The next non-blank character (not consumed); '' at the end."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.fill():
                return ""

    def expect(self, chars: str) -> str:
        c = self.skip_ws()
        if not c or c not in chars:
            where = self.consumed + self.pos
            got = repr(c) if c else "the end of the file"
            raise JSONStreamError(f"expected {' or '.join(repr(x) for x in chars)} at character {where}, got {got}")
        self.pos += 1
        return c

    def value(self):
        """Decode one JSON value at the current position, reading more text as needed."""
        self.skip_ws()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                # incomplete at the end of the buffer: read more and try again; a real error stays an error
                if self.fill():
                    continue
                raise JSONStreamError(f"invalid or truncated JSON at character {self.consumed + exc.pos}: "
                                      f"{exc.msg}") from None
            if end == len(self.text) and not self.eof:
                # a number (or literal) may continue in the next chunk
                if self.fill():
                    continue
            self.pos = end
            return value


def members(fh: IO[str], stream: str) -> Iterator[tuple]:
    """(key, value) of each top-level member; for `stream`, value is an iterator over the array's elements (it
    must be consumed before the next member is read). A document that is an array, not an object (the Chrome
    trace format's other form: the events alone), is one member, `stream`."""
    buf = _Buffer(fh)
    if buf.skip_ws() == "[":
        elements = _elements(buf)
        yield stream, elements
        for _ in elements:
            pass
        if buf.skip_ws():
            raise JSONStreamError(f"text after the array at character {buf.consumed + buf.pos}")
        return
    buf.expect("{[")  # '[' was taken above: an error here names both forms
    if buf.skip_ws() == "}":
        buf.pos += 1
        return
    while True:
        key = buf.value()
        if not isinstance(key, str):
            raise JSONStreamError("an object key is not a string")
        buf.expect(":")
        if key == stream:
            elements = _elements(buf)
            yield key, elements
            for _ in elements:  # whatever the caller left unread
                pass
        else:
            yield key, buf.value()
        if buf.expect(",}") == "}":
            return


def _elements(buf: _Buffer) -> Iterator:
    buf.expect("[")
    if buf.skip_ws() == "]":
        buf.pos += 1
        return
    while True:
        yield buf.value()
        if buf.expect(",]") == "]":
            return
