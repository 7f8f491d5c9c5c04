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


# ---- what text eva stores, and what a user may type ------------------------------------------

# The longest text one field may take from a user (a task prompt, a note, a dataset name, a
# config string): a prompt is a sentence, a note a few; it bounds what one option or request
# makes eva store in every episode row and export.
MAX_TEXT_CHARS = 2000


def storable_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored by every format (None when it can). The dataset validator's
    ``invalid_text`` rule: a lone surrogate (a JSON ``\\ud800`` escape, or a byte that was not
    UTF-8 in a command-line argument) is not Unicode and no UTF-8 file can hold it; a NUL ends an
    HDF5 string, so h5py refuses it."""
    for position, ch in enumerate(text):
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "character"
            return (
                f"holds a lone surrogate \\u{code:04x} at character {position}, not valid "
                f"Unicode (a {what} that is not UTF-8 text)"
            )
        if code == 0:
            return f"holds a NUL character at character {position} (an HDF5 string cannot)"
    return None


def text_problem(text: object, *, max_chars: int = MAX_TEXT_CHARS) -> str | None:
    """Why a value a user typed is refused (None when it is accepted): the one rule for task
    prompts, notes, dataset names and config strings, at every entry point (CLI options, console
    requests, config files). Accepted: a string of at most ``max_chars`` characters that the
    validator accepts (``storable_problem``) and that holds no control character (C0 with tab
    and newline, DEL, C1): one value is one line, and nothing typed can drive a terminal."""
    if not isinstance(text, str):
        return f"expected a string, got {type(text).__name__}"
    if len(text) > max_chars:
        return f"{len(text)} characters, at most {max_chars} are allowed"
    problem = storable_problem(text)
    if problem is not None:
        return problem
    for position, ch in enumerate(text):
        code = ord(ch)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return (
                f"control character {_escape(ch)} at character {position} is not allowed "
                "(one line of printable text)"
            )
    return None
