"""The console's HTTP side: a Starlette app over :class:`~eva.console.session.ConsoleSession`.

Security model (docs/console.md):
- it binds 127.0.0.1 unless another address is given explicitly;
- every request needs the start-up token: ``Authorization: Bearer <token>`` (scripts), or the
  ``eva_console_token`` cookie (HttpOnly, SameSite=Strict) that ``GET /?token=<token>`` sets for
  the page; the token is compared in constant time;
- a mutating request (POST/PUT/PATCH/DELETE) that carries an ``Origin`` must come from the
  console's own origin, and one without ``Origin`` must use the Bearer header: a cookie alone
  never authorises a cross-site write;
- clients name datasets as in ``collection.tasks``; the session derives every path.

Blocking work (file reads, exports, JPEG encoding) runs in the thread pool, never on the event
loop; the recorder's capture threads do not wait for any of it. Connections, headers and bodies
are bounded by ``eva.console.transport`` (hostile clients cannot cost a recording); a file is
served from the fd opened for that request (``eva.console.fileserve``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from eva.console.errors import ConsoleError
from eva.console.fileserve import OpenFileResponse
from eva.console.http_values import UnicodeSafeJSONResponse as JSONResponse
from eva.console.http_values import decimal, parse_json_body
from eva.console.session import ConsoleSession
from eva.console.transport import MAX_BODY, guarded_protocol, read_body, trust_connection
from eva.dataset.errors import error_line

log = logging.getLogger("eva.console")

STATIC_DIR = Path(__file__).parent / "static"
# The page runs only its own script and loads only its own resources: dataset text (notes,
# prompts, names) is shown through textContent, and should any of it ever end up parsed as HTML,
# an inline handler or a foreign script it smuggled in would not run.
PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' blob: data:; media-src 'self' blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
COOKIE = "eva_console_token"
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
EVENT_TICK_S = 0.5
EVENT_HEARTBEAT_S = 10.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
STATUS_CODES = {
    "bad_request": 400,
    "not_found": 404,
    "conflict": 409,
    "timeout": 408,
    "too_large": 413,
}
# refusals after which the rest of the request is not read: the connection is closed
CLOSING = {"timeout", "too_large", "unauthorized"}


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path`` readable by its owner only (0600), never through a symlink:
    a new file is created exclusively beside it and renamed over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return path


def default_token_file(log_dir: Path) -> Path:
    """``<log_dir>.console-token``: beside the log directory (not inside it, where datasets are)."""
    log_dir = Path(log_dir)
    return log_dir.parent / f"{log_dir.name}.console-token"


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "field": field}},
        status_code=status,
        headers={"connection": "close"} if code in CLOSING or status in (408, 413) else None,
    )


class TokenGuard:
    """ASGI middleware enforcing the token and the Origin rule on every HTTP request."""

    def __init__(
        self, app: ASGIApp, token: str, origins: set[str], *, same_host: bool = False
    ) -> None:
        self.app = app
        self.token = token.encode()
        self.origins = origins
        # Bound to a non-loopback address, the page's origin is whatever name the operator typed
        # (the host's IP or DNS name): accept the origin that matches the request's Host.
        self.same_host = same_host

    def _valid(self, candidate: str | None) -> bool:
        if not candidate:
            return False
        return hmac.compare_digest(candidate.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        method = scope["method"]
        path = scope["path"]
        if (
            method == "GET"
            and path == "/"
            and "token" in parse_qs(scope.get("query_string", b"").decode())
        ):
            token = parse_qs(scope["query_string"].decode())["token"][0]
            if not self._valid(token):
                await PlainTextResponse(
                    "invalid token", status_code=401, headers={"connection": "close"}
                )(scope, receive, send)
                return
            trust_connection(scope)
            # The token leaves the address bar (and the history) for an HttpOnly cookie.
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        header = request.headers.get("authorization", "")
        bearer = header[7:].strip() if header.lower().startswith("bearer ") else None
        by_header = self._valid(bearer)
        by_cookie = self._valid(request.cookies.get(COOKIE))
        if not (by_header or by_cookie):
            if path.startswith("/api/"):
                response = _error(401, "unauthorized", "missing or invalid token")
            else:
                response = PlainTextResponse(
                    "eva console: open the URL with ?token=... that `eva console` printed "
                    "(or read the token file)",
                    status_code=401,
                    headers={"connection": "close"},
                )
            await response(scope, receive, send)
            return
        trust_connection(scope)  # its later requests are still checked; it leaves the lower cap
        if method in MUTATING:
            origin = request.headers.get("origin")
            host = request.headers.get("host")
            own = origin in self.origins or (
                self.same_host and host is not None and origin == f"http://{host}"
            )
            if origin is not None and not own:
                await _error(403, "bad_origin", f"origin {origin!r} is not this console")(
                    scope, receive, send
                )
                return
            if origin is None and not by_header:
                await _error(
                    403, "bad_origin", "a cookie-authorised change needs an Origin header"
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _handler(
    fn: Callable[..., Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """Turn a ConsoleError into its 4xx JSON answer."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except ConsoleError as e:
            return _error(STATUS_CODES.get(e.kind, 400), e.code, str(e), e.field)
        except Exception as e:  # a bug: still one JSON line, and the traceback in the log
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(500, "internal_error", error_line(e))

    return wrapped


async def _body(request: Request) -> Any:
    raw = await read_body(request, MAX_BODY)
    return parse_json_body(raw)


def _call(fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """Run blocking session work in the thread pool, off the event loop."""
    return run_in_threadpool(fn, *args)


class _Endpoints:
    """The console's request handlers over one session (their routes: ``_routes``)."""

    def __init__(self, session: ConsoleSession) -> None:
        self.session = session

    async def index(self, request: Request) -> Response:
        return FileResponse(
            STATIC_DIR / "index.html",
            headers={"cache-control": "no-store", "content-security-policy": PAGE_POLICY},
        )

    async def status(self, request: Request) -> Response:
        return JSONResponse(await _call(self.session.status))

    async def datasets(self, request: Request) -> Response:
        return JSONResponse({"datasets": await _call(self.session.datasets)})

    async def formats(self, request: Request) -> Response:
        return JSONResponse({"formats": self.session.format_options()})

    async def collect_start(self, request: Request) -> Response:
        body = await _body(request)
        if not isinstance(body, dict):
            raise ConsoleError("bad_request", "bad_body", "the body must be a JSON object")
        unknown = sorted(set(body) - {"dataset", "task"})
        if unknown:
            raise ConsoleError(
                "bad_request",
                "bad_field",
                f"{unknown[0]}: not a field (use dataset, task)",
                unknown[0],
            )
        return JSONResponse(await _call(self.session.start, body.get("dataset"), body.get("task")))

    async def collect_stop(self, request: Request) -> Response:
        return JSONResponse(await _call(self.session.stop))

    async def collect_cancel(self, request: Request) -> Response:
        return JSONResponse(await _call(self.session.cancel))

    async def preview(self, request: Request) -> Response:
        key = request.path_params["camera"]
        after = request.query_params.get("after")
        result = await _call(self.session.preview_jpeg, key)
        if result is None:
            return Response(status_code=204)
        seq, t, data = result
        seen = decimal(after)
        if seen is not None and seen >= seq:
            return Response(status_code=204, headers={"x-preview-seq": str(seq)})
        return Response(
            data,
            media_type="image/jpeg",
            headers={
                "x-preview-seq": str(seq),
                "x-capture-time": repr(t),
                "cache-control": "no-store",
            },
        )

    async def episodes(self, request: Request) -> Response:
        return JSONResponse(await _call(self.session.episodes, request.path_params["name"]))

    async def review(self, request: Request) -> Response:
        body = await _body(request)
        p = request.path_params
        return JSONResponse(await _call(self.session.set_review, p["name"], p["index"], body))

    async def edit(self, request: Request) -> Response:
        body = await _body(request)
        p = request.path_params
        return JSONResponse(await _call(self.session.set_edits, p["name"], p["index"], body))

    async def video(self, request: Request) -> Response:
        p = request.path_params
        fd = await _call(self.session.video_fd, p["name"], p["index"], p["video_key"])
        try:
            return OpenFileResponse(
                fd,
                request.headers.get("range"),
                media_type="video/mp4",
                headers={"cache-control": "no-cache"},
            )
        except BaseException:
            os.close(fd)
            raise

    async def series(self, request: Request) -> Response:
        p = request.path_params
        return JSONResponse(
            await _call(
                self.session.series, p["name"], p["index"], request.query_params.get("max_points")
            )
        )

    async def exports(self, request: Request) -> Response:
        return JSONResponse(await _call(self.session.exports, request.path_params["name"]))

    async def export(self, request: Request) -> Response:
        body = await _body(request)
        job = await _call(self.session.start_export, request.path_params["name"], body)
        return JSONResponse(
            job, status_code=202, headers={"location": f"/api/jobs/{job['job_id']}"}
        )

    async def upload(self, request: Request) -> Response:
        body = await _body(request)
        job = await _call(self.session.start_upload, request.path_params["name"], body)
        return JSONResponse(
            job, status_code=202, headers={"location": f"/api/jobs/{job['job_id']}"}
        )

    async def host_key(self, request: Request) -> Response:
        return JSONResponse(await _call(self.session.host_key))

    async def trust_host_key(self, request: Request) -> Response:
        body = await _body(request)
        return JSONResponse(await _call(self.session.trust_host_key, body))

    async def jobs(self, request: Request) -> Response:
        return JSONResponse({"jobs": self.session.jobs()})

    async def job(self, request: Request) -> Response:
        return JSONResponse(self.session.job(request.path_params["id"]))

    async def events(self, request: Request) -> Response:
        return StreamingResponse(
            _status_events(request, self.session),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def not_found(self, request: Request) -> Response:
        return _error(404, "not_found", f"no such endpoint: {request.method} {request.url.path}")


async def _status_events(request: Request, session: ConsoleSession) -> AsyncIterator[str]:
    """The event stream: the status at each change (every tick while recording or while a job
    runs, else a heartbeat), and the active job whenever it changed."""
    yield "retry: 2000\n\n"
    sent_version = -1
    sent_state: str | None = None
    sent_job: str | None = None
    quiet = 0.0
    while True:
        if await request.is_disconnected():
            return
        status = await _call(session.status)
        live = status["state"] != "idle" or (
            status["active_job"] is not None
            and status["active_job"]["state"] in ("queued", "running")
        )
        changed = status["version"] != sent_version or status["state"] != sent_state
        if live or changed or quiet >= EVENT_HEARTBEAT_S:
            yield f"event: status\ndata: {json.dumps(status)}\n\n"
            sent_version = status["version"]
            sent_state = status["state"]
            quiet = 0.0
            job_text = json.dumps(status["active_job"]) if status["active_job"] else None
            if job_text is not None and job_text != sent_job:
                yield f"event: job\ndata: {job_text}\n\n"
                sent_job = job_text
        else:
            quiet += EVENT_TICK_S
        await asyncio.sleep(EVENT_TICK_S)


def _routes(endpoints: _Endpoints) -> list[BaseRoute]:
    h = _handler
    e = endpoints
    return [
        Route("/", h(e.index), methods=["GET"]),
        Route("/api/status", h(e.status), methods=["GET"]),
        Route("/api/datasets", h(e.datasets), methods=["GET"]),
        Route("/api/formats", h(e.formats), methods=["GET"]),
        Route("/api/collect/start", h(e.collect_start), methods=["POST"]),
        Route("/api/collect/stop", h(e.collect_stop), methods=["POST"]),
        Route("/api/collect/cancel", h(e.collect_cancel), methods=["POST"]),
        Route("/api/preview/{camera}", h(e.preview), methods=["GET"]),
        Route("/api/datasets/{name}/episodes", h(e.episodes), methods=["GET"]),
        Route("/api/datasets/{name}/episodes/{index}/qc", h(e.review), methods=["PUT"]),
        Route("/api/datasets/{name}/episodes/{index}/edit", h(e.edit), methods=["PUT"]),
        Route(
            "/api/datasets/{name}/episodes/{index}/video/{video_key}", h(e.video), methods=["GET"]
        ),
        Route("/api/datasets/{name}/episodes/{index}/series", h(e.series), methods=["GET"]),
        Route("/api/datasets/{name}/exports", h(e.exports), methods=["GET"]),
        Route("/api/datasets/{name}/export", h(e.export), methods=["POST"]),
        Route("/api/datasets/{name}/upload", h(e.upload), methods=["POST"]),
        Route("/api/upload/host-key", h(e.host_key), methods=["GET"]),
        Route("/api/upload/host-key", h(e.trust_host_key), methods=["POST"]),
        Route("/api/jobs", h(e.jobs), methods=["GET"]),
        Route("/api/jobs/{id}", h(e.job), methods=["GET"]),
        Route("/api/events", h(e.events), methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
        Route("/api/{rest:path}", e.not_found, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ]


def create_app(
    session: ConsoleSession, token: str, origins: set[str], *, same_host: bool = False
) -> Starlette:
    """The console's ASGI app (routes listed in docs/console.md); ``same_host`` also accepts
    changes from the origin that matches the request's Host (for a non-loopback bind)."""
    app = Starlette(routes=_routes(_Endpoints(session)))
    app.add_middleware(TokenGuard, token=token, origins=origins, same_host=same_host)
    return app


def allowed_origins(host: str, port: int) -> set[str]:
    """The console's own origins: the bound address, and the loopback names when it is loopback."""
    names = {host if ":" not in host else f"[{host}]"}
    if host in LOOPBACK:
        names |= {"127.0.0.1", "localhost", "[::1]"}
    return {f"http://{name}:{port}" for name in names}


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port; the URL names the real one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    session: ConsoleSession,
    *,
    host: str,
    port: int,
    token: str,
    on_ready: Callable[[str], None],
) -> None:
    """Serve until SIGINT/SIGTERM; ``on_ready(url)`` is called once the server runs (its signal
    handlers are in place: a Ctrl-C right after the URL appears shuts it down like any other)."""
    import threading
    import time

    import uvicorn

    sock = bind(host, port)
    actual_port = sock.getsockname()[1]
    url_host = host if ":" not in host else f"[{host}]"
    loopback = host in LOOPBACK
    app = create_app(session, token, allowed_origins(host, actual_port), same_host=not loopback)
    config = uvicorn.Config(
        app,
        http=guarded_protocol(),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    url = f"http://{url_host}:{actual_port}/?token={token}"

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.01)
        if server.started:
            on_ready(url)

    threading.Thread(target=announce, name="eva-console-ready", daemon=True).start()
    server.run(sockets=[sock])
