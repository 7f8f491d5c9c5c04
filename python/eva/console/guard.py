"""The connection guard of ``eva.console.transport``: uvicorn's httptools protocol with the
transport's caps (connections, untrusted connections, header time and size) enforced.

A subclass of uvicorn internals, not of its API: ``transport.missing_uvicorn_internals`` lists
what it relies on, and tests/test_console_hostile.py checks it against a real uvicorn server.
Build one with ``transport.guarded_protocol``, which sets the class's ``limits`` and its live
``counts``; this module imports uvicorn (the console extra's), so only a server imports it.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eva.console.transport import (
    HEADERS_TOO_LARGE,
    TRUST_EXTENSION,
    ConnectionCounts,
    ConnectionLimits,
)

__all__ = ["GuardedProtocol"]


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol, counting its connections in ``counts`` within ``limits``."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    counts: ClassVar[ConnectionCounts] = ConnectionCounts()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._admitted = False
        self._trusted = False
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if (
            self.counts.open >= self.limits.max_connections
            or self.counts.untrusted >= self.limits.max_untrusted
        ):
            self.counts.refused += 1
            transport.abort()
            return
        self._admitted = True
        self.counts.open += 1
        self.counts.untrusted += 1
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self.counts.open -= 1
        if not self._trusted:
            self.counts.untrusted -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        super().data_received(data)
        # bytes of a chunk after which the headers are still incomplete: a header that
        # never ends is held by the parser, so its size is bounded here
        if self._deadline is not None and self._admitted:
            self._header_bytes += len(data)
            if (
                self._header_bytes > self.limits.max_header_bytes
                and not self.transport.is_closing()
            ):
                self.transport.write(HEADERS_TOO_LARGE)
                self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self.scope.setdefault("extensions", {})[TRUST_EXTENSION] = {"trust": self._trust}
        super().on_headers_complete()

    def _trust(self) -> None:
        if self._admitted and not self._trusted:
            self._trusted = True
            self.counts.untrusted -= 1

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.counts.timed_out += 1
            self.transport.close()
