"""``eva console``: serve the operator console for a config."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from eva._native import NativeCoreError
from eva.cli.collect import MAX_SEED
from eva.cli.collect_screen import CaptureLogHandler, LogLimiter
from eva.cli.output import EXIT_USAGE, fail, first_line, say, verbosity_options

if TYPE_CHECKING:
    from eva.console.session import ConsoleSession


@click.command("console")
@verbosity_options()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback must be given explicitly.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8750,
    show_default=True,
    help="TCP port (0: any free port; the printed URL names it).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the access token, mode 0600 (default: <log_dir>.console-token "
    "beside the log directory).",
)
@click.option(
    "--source",
    default=None,
    help="Override the config's sources: sim | replay:PATH (a v2.1 dataset).",
)
@click.option(
    "--seed", type=click.IntRange(0, MAX_SEED), default=0, help="Seed of the simulated rig."
)
@click.option(
    "--known-hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="known_hosts for uploads (default: storage.sftp.known_hosts).",
)
def console_command(
    config: Path,
    host: str,
    port: int,
    token_file: Path | None,
    source: str | None,
    seed: int,
    known_hosts: Path | None,
) -> None:
    """Serve the operator console: COLLECT, QUALITY CHECK, EXPORT and UPLOAD in a browser.

    It prints a URL with a fresh access token and serves until Ctrl-C; scripts send the token
    as `Authorization: Bearer TOKEN` (it is also written to --token-file), e.g. curl -H
    "Authorization: Bearer $(cat TOKEN_FILE)" http://127.0.0.1:8750/api/status. The JSON API is
    the same control channel as the page: see docs/console.md.

    \b
    Example:
      eva console demo-data/collect.toml
    """
    try:
        from eva.console.server import default_token_file, new_token, serve, write_token_file
    except NativeCoreError as e:
        fail(str(e))
    except ImportError as e:
        fail(f"eva console needs the console extra (pip install 'eva[console]'): {e}", EXIT_USAGE)
    _prepare_process()
    session = _open_session(config, source, seed, known_hosts)
    token = new_token()
    path = token_file or default_token_file(session.config.log_dir)
    try:
        write_token_file(path, token)
    except OSError as e:
        session.close()
        fail(f"--token-file {path}: {e.strerror or e}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"eva: warning: serving on {host}: reachable from other hosts", err=True)
    if session.source_note:
        say(f"eva: note: {session.source_note}", err=True)

    def ready(url: str) -> None:
        for stream, text in session.source.streams.items():
            say(f"eva console: {stream}: {text}", err=True)
        click.echo(f"eva console: token written to {path}", err=True)
        click.echo(url)
        sys.stdout.flush()

    try:
        serve(session, host=host, port=port, token=token, on_ready=ready)
    except OSError as e:
        fail(f"console: cannot listen on {host}:{port}: {e.strerror or e}")
    finally:
        session.close()


def _prepare_process() -> None:
    """What recording in this process needs, and capture warnings on stderr."""
    import logging
    import os

    from eva.capture.recorder import pin_mmap_threshold, shorten_switch_interval
    from eva.libc import raise_open_file_limit

    if os.environ.get("EVA_CAPTURE_MALLOC", "pin") != "keep":
        pin_mmap_threshold()  # flat RSS over long sessions (see pin_mmap_threshold)
    shorten_switch_interval()  # capture threads keep up beside busy Python threads
    raise_open_file_limit()  # saving an episode never runs out of descriptors
    # Capture warnings (backlog, recovered leftovers, a stalled source) reach the page through
    # the session and the server's stderr through this handler, one line each.
    capture_log = logging.getLogger("eva.capture")
    capture_log.addHandler(CaptureLogHandler(LogLimiter(), logging.WARNING))
    capture_log.setLevel(logging.INFO)


def _open_session(
    config: Path, source: str | None, seed: int, known_hosts: Path | None
) -> ConsoleSession:
    """The console's session over ``config``, once every source delivered a first sample
    (exits with a one-line error otherwise)."""
    from eva.capture.sources import SourceSpecError
    from eva.console.errors import ConsoleError
    from eva.console.session import ConsoleSession

    try:
        session = ConsoleSession(config, source=source, seed=seed, sftp_known_hosts=known_hosts)
    except (ConsoleError, SourceSpecError) as e:
        fail(str(e), EXIT_USAGE)
    except Exception as e:  # noqa: BLE001 - a recorder that cannot start: one line
        fail(f"console: {first_line(str(e)) or type(e).__name__}")
    problems = session.source.check()  # every configured source delivers a first sample
    if problems:
        session.close()
        for line in problems:
            say(f"eva: error: {line}", err=True)
        sys.exit(EXIT_USAGE)
    return session
