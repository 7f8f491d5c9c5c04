"""Values that cross HTTP: request bodies and path or query numbers parsed strictly, and JSON
answers that any dataset text can travel in.

A client is hostile input like a dataset: a body nested 30,000 levels deep, an episode index
of 5,000 digits or a superscript digit (which ``str.isdigit`` accepts and ``int`` refuses) is a
4xx naming the field, never a 500. A dataset's text may be what its validator refuses (a lone
surrogate in a hand-edited note, NaN in a hand-edited duration): the console still answers, so
that the operator can see and fix it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.responses import JSONResponse

from eva.console.errors import bad_request
from eva.textsafe import text_problem

# The deepest nesting a request body may have: the API's bodies are two levels deep
# (``{"options": {...}}``); Python's JSON parser would recurse once per level.
MAX_JSON_DEPTH = 32
# An index or count in a path or query: 1 to 18 ASCII digits (an int64). ``str.isdigit`` passes
# "²", which ``int`` refuses; ``int`` takes other scripts' digits ("٣") and 4,300 digits at most.
_DECIMAL = re.compile(r"[0-9]{1,18}")
# JSON strings (their brackets are text) and brackets, for the depth scan; possessive, so an
# unterminated string cannot make the scan backtrack.
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def json_depth_over(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects more than ``limit`` deep."""
    depth = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', raw)):
        if match.group() in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def parse_json_body(raw: bytes) -> Any:
    """A request body's JSON ({} for an empty body); 400 ``bad_json`` for anything else, a body
    nested more than ``MAX_JSON_DEPTH`` levels included."""
    if not raw.strip():
        return {}
    if json_depth_over(raw):
        raise bad_request("bad_json", f"body is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(raw)
    except RecursionError:  # not reached after the scan; kept as the parser's own bound
        raise bad_request("bad_json", "body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request("bad_json", f"body is not JSON: {e}") from None


def decimal(value: object) -> int | None:
    """``value`` as a non-negative int: an int, or 1-18 ASCII digits; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    return None


def episode_index(value: object) -> int:
    """An episode index from a path (``.../episodes/{index}/...``); 400 naming ``index``."""
    index = decimal(value)
    if index is None:
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        raise bad_request(
            "bad_field", f"episode index {shown!r} is not an integer >= 0 (ASCII digits)", "index"
        )
    return index


def typed_text(value: object, field: str) -> str:
    """A string field a user typed (a task prompt, a note): the one rule for typed text
    (``eva.textsafe.text_problem``), 400 naming ``field``."""
    problem = text_problem(value)
    if problem is not None:
        raise bad_request("bad_field", f"{field}: {problem}", field)
    assert isinstance(value, str)
    return value


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class UnicodeSafeJSONResponse(JSONResponse):
    """Starlette's JSONResponse for content that may hold what a dataset's validator refuses:
    a lone surrogate (which UTF-8 cannot encode) is sent as its ``\\uXXXX`` escape, the JSON
    reading of the same string; NaN and infinity (which JSON cannot hold) as null."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # UnicodeEncodeError; or a non-finite float (allow_nan=False)
            pass
        return json.dumps(
            _finite(content), ensure_ascii=True, allow_nan=False, separators=(",", ":")
        ).encode("ascii")
