"""The command line's shape: commands listed in workflow order with summaries equal to their own
help, and each command's module imported only when that command is used."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner
from terminal_helpers import run_on_a_terminal

from eva.cli import COMMANDS, main

WORKFLOW = ["collect", "qc", "edit", "export", "verify", "upload"]


def test_top_level_help_lists_commands_in_workflow_order() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line]
    assert listed[: len(WORKFLOW)] == WORKFLOW
    assert sorted(listed) == sorted(COMMANDS)
    for _, _, summary in COMMANDS.values():
        assert summary in result.output  # whole, not cut off


def test_summaries_are_the_commands_own_first_help_line() -> None:
    ctx = click.Context(main)
    for name, (_, _, summary) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name
        assert (command.help or "").strip().splitlines()[0] == summary, name


def test_help_imports_no_command_module() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from eva.cli import COMMANDS, main\n"
        "CliRunner().invoke(main, ['--help'])\n"
        "print(sorted({m for m, _, _ in COMMANDS.values()} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _on_a_terminal(command: list[str]) -> tuple[int, str, str]:
    """Run ``command`` with stdout and stderr on a pseudo-terminal 200 columns wide; returns
    (exit status, what the terminal showed without colour/cursor codes, last frame)."""
    status, shown = run_on_a_terminal(command)
    frames = [f for f in shown.replace("\r\n", "\n").split("\r") if "export" in f]
    return status, shown, frames[-1] if frames else ""


def test_export_progress_bar_on_a_terminal(small_dataset) -> None:
    status, shown, last = _on_a_terminal(
        [sys.executable, "-m", "eva.cli", "export", str(small_dataset), "--format", "hdf5"]
    )
    assert status == 0, shown
    assert "export hdf5: publishing" in last and "100%" in last, shown
    assert "elapsed" in last and "eta" in last and "files" in last
    assert "accepted: " in shown  # the result lines follow the bar
