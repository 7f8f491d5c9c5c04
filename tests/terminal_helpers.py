"""Running the CLI on a pseudo-terminal, as an operator's shell would."""

from __future__ import annotations

import os
import re
import threading

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def drain_terminal(controller: int) -> tuple[threading.Thread, list[bytes]]:
    """Read the controller side of a pty on a thread until it closes (a full terminal buffer
    would block the CLI); returns the thread and the list its chunks go into."""
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal side is closed and drained
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    return reader, chunks


def plain_text(shown: bytes) -> str:
    """What a terminal showed, without colour and cursor codes."""
    return ANSI.sub("", shown.decode(errors="replace"))


def run_on_a_terminal(command: list[str], columns: int = 200) -> tuple[int, str]:
    """Run ``command`` with stdout and stderr on a pseudo-terminal ``columns`` wide; returns
    (exit status, what the terminal showed without colour/cursor codes)."""
    import pty
    import subprocess

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    os.close(terminal)
    reader, chunks = drain_terminal(controller)
    status = process.wait(timeout=120)
    reader.join(30)
    os.close(controller)
    return status, plain_text(b"".join(chunks))
