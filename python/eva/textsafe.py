"""Text from a dataset made safe to show: no terminal control sequences, no undecodable strings.

A dataset is someone else's input. Its notes, task prompts, feature keys, file names and error
messages quoting them reach a terminal through the CLI; an ESC, BEL or C1 control in them would
let the dataset move the cursor, clear the screen, set the window title or fake output, and a
lone surrogate (from a ``\\udcXX`` escape in JSON, or a non-UTF-8 file name) makes printing fail.
``printable`` turns every such character into a visible backslash escape, so what is shown is
exactly what the dataset holds, one line per call.
"""

from __future__ import annotations

import json
from typing import Any

# Invisible characters that reorder or break the text a terminal or an editor shows (bidi
# embeddings/overrides/isolates and their marks, line and paragraph separators, zero-width
# space); shown escaped, like the controls, so a note cannot hide or reorder what follows it.
_INVISIBLE = frozenset(
    [0x061C, 0x200B, 0x200E, 0x200F, 0x2028, 0x2029, 0xFEFF]
    + list(range(0x202A, 0x202F))
    + list(range(0x2066, 0x206A))
)


def _unsafe(code: int) -> bool:
    return (
        code < 0x20  # C0, newline and tab included: one value never spans lines
        or 0x7F <= code <= 0x9F  # DEL and C1 (0x9B is a one-byte CSI on some terminals)
        or 0xD800 <= code <= 0xDFFF  # lone surrogates: not encodable
        or code in _INVISIBLE
    )


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: object) -> str:
    """``text`` (``str()`` of anything) with every control, lone surrogate and invisible
    reordering character replaced by its ``\\xNN`` / ``\\uNNNN`` escape."""
    text = text if isinstance(text, str) else str(text)
    if not any(_unsafe(ord(ch)) for ch in text):
        return text
    return "".join(_escape(ch) if _unsafe(ord(ch)) else ch for ch in text)


def json_line(obj: Any) -> str:
    """One JSON document on one line, readable (non-ASCII kept) but with the characters
    ``printable`` escapes written as JSON ``\\uNNNN`` escapes: a parser gets the same data back,
    a terminal shows no control sequence. ``json.dumps`` alone escapes C0 only."""
    text = json.dumps(obj, ensure_ascii=False, default=str)
    if not any(_unsafe(ord(ch)) for ch in text):
        return text
    # Outside strings json.dumps emits no such character; inside, C0 is escaped already.
    return "".join(f"\\u{ord(ch):04x}" if _unsafe(ord(ch)) else ch for ch in text)
