"""The console's connections under hostile clients: what one costs, and for how long.

The console runs in the process that records, so nothing a client does may cost a recording:
capture and saving need file descriptors, memory and the event loop's time. uvicorn bounds
none of them by itself (no header timeout, no connection cap, a request body read whole), so:

- at most ``MAX_CONNECTIONS`` open connections, of which at most ``MAX_UNTRUSTED`` have not yet
  carried a request with a valid token; a connection beyond either cap is closed as it is
  accepted, before anything is read from it;
- a request's headers must be complete within ``HEADER_TIMEOUT_S`` of the connection (or of
  the request's first byte) and within ``MAX_HEADER_BYTES``, or the connection is closed;
- a body is read as it streams and refused (413) at ``MAX_BODY`` + 1 bytes, whatever the
  Content-Length says and with chunked transfer encoding too; a body must arrive within
  ``BODY_TIMEOUT_S`` (408);
- ``eva.libc.raise_open_file_limit`` lifts the soft descriptor limit at start, so the caps sit
  far below it.

The guard (``eva.console.guard``) is a subclass of uvicorn's httptools protocol (a dependency of
the console extra), hooked where the parser reports a request's first byte and its complete headers. Those are
uvicorn internals, not its API: ``missing_uvicorn_internals`` lists what the guard relies on that
the installed uvicorn lacks, the canary tests in tests/test_console_hostile.py check it and the
guard's behaviour against a real uvicorn server, and pyproject.toml bounds uvicorn to releases
that passed them.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.types import Scope

from eva.console.errors import ConsoleError

MAX_CONNECTIONS = 256
MAX_UNTRUSTED = 64
HEADER_TIMEOUT_S = 5.0
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY = 64 * 1024
BODY_TIMEOUT_S = 30.0
# the ASGI scope extension through which the token check marks its connection trusted
TRUST_EXTENSION = "eva.connection"
HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-length: 0\r\nconnection: close\r\n\r\n"
)


# What the guard overrides in uvicorn.protocols.http.httptools_impl.HttpToolsProtocol: each
# method's parameters after self (uvicorn calls connection_made/lost and data_received as an
# asyncio protocol; httptools calls on_message_begin and on_headers_complete on the protocol
# it parses for), and the attributes of the protocol the guard reads.
HOOKED_METHODS: dict[str, tuple[str, ...]] = {
    "connection_made": ("transport",),
    "connection_lost": ("exc",),
    "data_received": ("data",),
    "on_message_begin": (),
    "on_headers_complete": (),
}
READ_ATTRIBUTES = ("loop", "transport", "scope")
# the parser must call back the protocol itself, or the hooks above are never called
PARSER_OF_SELF = "httptools.HttpRequestParser(self)"


def missing_uvicorn_internals() -> list[str]:
    """The uvicorn internals the guard relies on that the installed uvicorn lacks or changed
    (``[]`` when all are as expected), each naming the installed version."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    missing = []
    for name, expected in HOOKED_METHODS.items():
        method = getattr(HttpToolsProtocol, name, None)
        if not callable(method):
            missing.append(f"HttpToolsProtocol.{name} is gone")
            continue
        parameters = tuple(p for p in inspect.signature(method).parameters if p != "self")
        if parameters != expected:
            missing.append(
                f"HttpToolsProtocol.{name}({', '.join(parameters)}) instead of "
                f"({', '.join(expected)})"
            )
    try:
        source = inspect.getsource(HttpToolsProtocol)
    except (OSError, TypeError):  # no source installed: only the methods can be checked
        source = None
    if source is not None:
        for attribute in READ_ATTRIBUTES:
            if not re.search(rf"self\.{attribute}\s*(:[^=\n]*)?=", source):
                missing.append(f"HttpToolsProtocol sets no self.{attribute}")
        if PARSER_OF_SELF not in source:
            missing.append(f"HttpToolsProtocol does not build {PARSER_OF_SELF}")
    version = getattr(uvicorn, "__version__", "?")
    return [f"{item} (uvicorn {version})" for item in missing]


@dataclass
class ConnectionLimits:
    max_connections: int = MAX_CONNECTIONS
    max_untrusted: int = MAX_UNTRUSTED
    header_timeout_s: float = HEADER_TIMEOUT_S
    max_header_bytes: int = MAX_HEADER_BYTES


@dataclass
class ConnectionCounts:
    """Connections open now (``open``, ``untrusted`` among them) and refused so far."""

    open: int = 0
    untrusted: int = 0
    refused: int = 0
    timed_out: int = 0


def trust_connection(scope: Scope) -> None:
    """Mark the connection that carried ``scope`` as holding a valid token (the token check
    calls it); a no-op under a server without the guard."""
    extension = scope.get("extensions", {}).get(TRUST_EXTENSION)
    if extension is not None:
        extension["trust"]()


def guarded_protocol(
    limits: ConnectionLimits | None = None, counts: ConnectionCounts | None = None
) -> type[asyncio.Protocol]:
    """A uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) enforcing ``limits``; its
    ``counts`` attribute is the live ``ConnectionCounts`` of every connection it served."""
    # uvicorn is the console extra's: imported when a server is built, not with this module
    from eva.console.guard import GuardedProtocol

    attributes = {"limits": limits or ConnectionLimits(), "counts": counts or ConnectionCounts()}
    return type("GuardedProtocol", (GuardedProtocol,), attributes)


async def read_body(
    request: Request, limit: int = MAX_BODY, timeout_s: float = BODY_TIMEOUT_S
) -> bytes:
    """The request's body, read as it arrives and refused past ``limit`` bytes (413; a
    Content-Length above it is refused before reading) or after ``timeout_s`` (408)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large(limit)
    except TimeoutError:
        raise ConsoleError(
            "timeout", "body_timeout", f"request body not complete within {timeout_s:g} s"
        ) from None
    return bytes(body)


def too_large(limit: int) -> ConsoleError:
    return ConsoleError("too_large", "body_too_large", f"request body over {limit} bytes")
