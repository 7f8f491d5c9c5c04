"""The console's refusals: one error type that the HTTP side turns into a status and a JSON body."""

from __future__ import annotations

from collections.abc import Mapping


class ConsoleError(Exception):
    """A refused request: ``kind`` is bad_request | not_found | conflict; ``code`` a stable
    identifier; ``field`` the request field it concerns (if any). The message is one line."""

    def __init__(self, kind: str, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.field = field


def bad_request(code: str, message: str, field: str | None = None) -> ConsoleError:
    return ConsoleError("bad_request", code, message, field)


def not_found(code: str, message: str, field: str | None = None) -> ConsoleError:
    return ConsoleError("not_found", code, message, field)


def conflict(code: str, message: str, field: str | None = None) -> ConsoleError:
    return ConsoleError("conflict", code, message, field)


def check_body(body: object, fields: tuple[str, ...]) -> None:
    """Refuse a request body that is not a JSON object, or that has a field not in ``fields``."""
    if not isinstance(body, Mapping):
        raise bad_request("bad_body", "the body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise bad_request(
            "bad_field", f"{unknown[0]}: not a field (use {', '.join(fields)})", unknown[0]
        )
