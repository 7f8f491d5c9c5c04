"""The CLI's conventions, the same for every command (docs/cli.md): exit codes 0/1/2/130, --format
as a choice of names and aliases, -q/-v everywhere, text unless --json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import COMMANDS, main
from eva.formats import catalog


def _invoke(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    "args",
    [
        ["export", "{ds}", "--format", "zip"],
        ["verify", "{ds}", "--format", "zip"],
        ["upload", "{ds}", "--format", "zip"],
        ["cleanup", "{ds}", "--format", "zip"],
    ],
)
def test_a_bad_format_is_a_usage_error_everywhere(small_dataset: Path, args: list[str]) -> None:
    result = _invoke(*[a.format(ds=small_dataset) for a in args])
    assert result.exit_code == 2, result.output
    assert "'zip' is not one of" in result.output and "lerobot_v3" in result.output


def test_format_names_and_aliases_in_any_case(small_dataset: Path) -> None:
    result = _invoke("export", str(small_dataset), "--format", "V21")
    assert result.exit_code == 0, result.output
    assert (small_dataset.parent / "export" / "lerobot_v21" / "accepted").is_dir()


# Every command that takes a path, invoked with all else valid and the path missing ({m}).
MISSING_PATH_CALLS = {
    "collect": ["{m}", "--check"],
    "qc": ["{m}", "--list"],
    "edit": ["{m}", "0", "--drop"],
    "export": ["{m}", "--format", "v21"],
    "verify": ["{m}"],
    "upload": ["{ds}", "--format", "v21", "--config", "{m}"],
    "merge": ["{ds}", "{m}", "--into", "{out}"],
    "info": ["{m}"],
    "validate": ["{m}"],
    "cleanup": ["{m}"],
    "recover": ["{m}"],
    "console": ["{m}"],
}


def test_every_command_taking_a_path_is_checked_for_a_missing_one() -> None:
    ctx = click.Context(main)
    takes_path = set()
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        if any(isinstance(p.type, click.Path) for p in command.params):
            takes_path.add(name)
    assert takes_path <= set(MISSING_PATH_CALLS), takes_path - set(MISSING_PATH_CALLS)


@pytest.mark.parametrize("command", list(MISSING_PATH_CALLS))
def test_a_missing_path_is_one_usage_line(
    small_dataset: Path, tmp_path: Path, command: str
) -> None:
    missing = tmp_path / "nonexistent"
    args = [
        a.format(m=missing, ds=small_dataset, out=tmp_path / "out")
        for a in MISSING_PATH_CALLS[command]
    ]
    result = _invoke(command, *args)
    assert result.exit_code == 2, (command, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("eva: error: "), (command, result.stderr)
    assert str(missing) in lines[0]


def test_usage_errors_of_eva_itself_are_one_line_too() -> None:
    for args in (["--bogus"], ["bogus"]):
        result = _invoke(*args)
        assert result.exit_code == 2
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("eva: error: ")
    assert _invoke().output.startswith("Usage: ")  # no arguments: the help


def test_a_missing_format_names_the_formats_on_one_line(small_dataset: Path) -> None:
    for command in ("export", "upload"):
        result = _invoke(command, str(small_dataset))
        assert result.exit_code == 2
        assert result.stderr.splitlines() == [
            f"eva: error: {command}: Missing option '--format'. Choose {catalog.help_line()}. "
            f"Try 'eva {command} --help' for help."
        ]


def test_every_command_takes_quiet_and_verbose() -> None:
    ctx = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        flags = {opt for p in command.params for opt in getattr(p, "opts", [])}
        assert {"-q", "--quiet", "-v", "--verbose"} <= flags, name


def test_validate_names_the_fixing_command_and_details_with_verbose(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=8)
    info = raw / "meta" / "info.json"
    info.write_text(info.read_text().replace('"total_frames": 16', '"total_frames": 9'))
    result = _invoke("validate", str(raw))
    assert result.exit_code == 1
    assert f"fix: eva cleanup {raw}" in result.output
    verbose = _invoke("validate", "-v", str(raw))
    assert f"at file {info}" in verbose.output
    quiet = _invoke("validate", "-q", str(raw))
    assert "totals_mismatch" not in quiet.output and "1 problem(s)" in quiet.output


def test_a_refused_export_points_to_validate(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=2, frames=8)
    for ep in (0, 1):
        (raw / f"videos/chunk-000/observation.images.front/episode_{ep:06d}.mp4").unlink()
    result = _invoke("export", str(raw), "--format", "v21")
    assert result.exit_code == 1
    assert f"more problems: eva validate {raw} lists them" in result.output


def test_ctrl_c_exits_130_saying_what_was_kept(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=4, frames=150, width=320, height=240)
    process = subprocess.Popen(
        [sys.executable, "-m", "eva.cli", "export", str(raw), "--format", "hdf5", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # the first progress event: the export is writing
    assert '"event": "progress"' in first, first
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    if process.returncode == 0:
        pytest.skip("the export finished before the interrupt")
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("eva: interrupted: the published pair"), err
    assert "Aborted" not in err and "Traceback" not in err
    assert not (tmp_path / "export" / "hdf5" / "accepted").exists()


def test_json_progress_events_are_printed_once_with_their_documented_nulls(
    small_dataset: Path,
) -> None:
    result = _invoke("export", str(small_dataset), "--format", "hdf5", "--json")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False)), lines
    events = [json.loads(line) for line in lines]
    progress = [e for e in events if e["event"] == "progress"]
    assert progress and events[-1]["event"] == "completed"
    # docs/cli.md: an export knows its episodes before writing, not its files or bytes
    assert all(e["total_files"] is None and e["total_bytes"] is None for e in progress)
    assert all(e["total_episodes"] == progress[0]["total_episodes"] for e in progress)
    assert progress[0]["current"] is None


def test_text_output_whatever_stdout_is(small_dataset: Path) -> None:
    piped = subprocess.run(
        [sys.executable, "-m", "eva.cli", "export", str(small_dataset), "--format", "mcap"],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.startswith("accepted: "), piped.stdout


def test_qc_ranges_lists_all_or_none_and_details_in_the_listing(tmp_path: Path) -> None:
    issue = {"severity": "red", "code": "frozen_camera", "detail": "camera front frozen from 19"}
    raw = write_synthetic_dataset(
        tmp_path / "raw",
        episodes=6,
        frames=6,
        quality=["green", "red", "green", "green", "green", "green"],
        quality_issues=[None, [issue], None, None, None, None],
    )
    assert _invoke("qc", str(raw), "2-4,0", "--fail", "--note", "bad light").exit_code == 0
    rows = {r["episode_index"]: r for r in map(json.loads, (raw / "meta/episodes.jsonl").open())}
    assert [e for e, r in rows.items() if r.get("qc_verdict") == "fail"] == [0, 2, 3, 4]
    # one unknown episode refuses the whole update
    refused = _invoke("qc", str(raw), "1,9", "--pass")
    assert refused.exit_code == 1 and "episode 9 does not exist" in refused.output
    rows = {r["episode_index"]: r for r in map(json.loads, (raw / "meta/episodes.jsonl").open())}
    assert "qc_verdict" not in rows[1]
    assert _invoke("qc", str(raw), "3-1", "--pass").exit_code == 2
    assert _invoke("qc", str(raw), "2", "--clear").exit_code == 0
    listing = _invoke("qc", str(raw), "--list").output.splitlines()
    assert listing[0].split()[:6] == ["ep", "frames", "quality", "verdict", "subset", "reason"]
    assert "frozen_camera: camera front frozen from 19" in listing[2]
    assert "note: bad light" in listing[4]
    # aligned: every row's subset column starts where the header's does
    column = listing[0].index("subset")
    assert all(line[column:].split()[0] in ("accepted", "rejected") for line in listing[1:-1])


def test_qc_warns_once_per_export_as_it_becomes_stale(tmp_path: Path) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=4, frames=6)
    for fmt in ("hdf5", "mcap"):
        assert _invoke("export", str(raw), "--format", fmt).exit_code == 0

    def warnings(*args: str) -> list[str]:
        result = _invoke("qc", str(raw), *args)
        assert result.exit_code == 0, result.output
        return [line for line in result.stderr.splitlines() if "is now stale" in line]

    became = warnings("0-1", "--fail")  # two episodes, two exports: one line per export
    assert len(became) == 2 and {"hdf5", "mcap"} == {w.split()[3] for w in became}, became
    assert warnings("2", "--fail") == []  # stale already: warned of before
    assert warnings("0-2", "--clear") == []  # current again
    assert len(warnings("3", "--fail")) == 2


@pytest.mark.parametrize("fmt", catalog.names())
def test_info_understands_exports(small_dataset: Path, fmt: str) -> None:
    assert _invoke("export", str(small_dataset), "--format", fmt).exit_code == 0
    accepted = small_dataset.parent / "export" / fmt / "accepted"
    result = _invoke("info", str(accepted), "--episodes")
    assert result.exit_code == 0, result.output
    text = result.output
    assert f"{fmt} export, accepted subset of {small_dataset.resolve()}" in text
    assert ("(decoded frames embedded)" in text) == (fmt in ("hdf5", "mcap", "zarr"))
    assert "marker" in text and ": published (export " in text and "review    current" in text
    assert "vectors   observation.state [14]" in text and "size " in text
    summary = json.loads(_invoke("info", str(accepted), "--json").output)
    assert summary["kind"] == "export" and summary["format"] == fmt
    assert summary["episodes"] == 2 and summary["marker"]["matches"]
    # a later verdict makes it stale
    assert _invoke("qc", str(small_dataset), "0", "--fail").exit_code == 0
    assert "review    STALE: " in _invoke("info", str(accepted)).output


def test_progress_shows_names_as_they_are_not_as_markup() -> None:
    """A file or dataset name holding rich markup ("[red]", "[/]") is printed literally."""
    import io

    from eva.cli.progress import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with ProgressBar("x [b]p[/b]", total=2, stream=out) as bar:  # short: an 80-column line
        bar.update(1, detail="e[red]1[/]")
        bar.stage("[i]")
    text = out.getvalue()
    assert "e[red]1[/]" in text
    assert "x [b]p[/b]: [i]" in text


@pytest.mark.parametrize("width", [40, 50, 60, 70, 80, 100, 140])
def test_a_shortened_progress_line_keeps_its_eta(width: int) -> None:
    """On a narrow terminal the name, detail, bar, elapsed time and rate give way, never the
    counts or the ETA (rich alone cut every column, the ETA's value too)."""
    import io
    import re

    from eva.cli.progress import ProgressBar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with ProgressBar("export lerobot_v3 of a long dataset name", total=40, stream=out) as bar:
        bar._progress.console.width = width  # the terminal's width
        for done in range(1, 4):
            bar.update(done, detail=f"{done * 7} files, 12.3 MB")
    last = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue()).replace("\r", "\n")
    line = [text for text in last.splitlines() if text.strip()][-1]
    assert len(line.rstrip()) <= width, line
    assert " 3/40 " in line and re.search(r"eta (\d+:\d\d:\d\d|-:--:--)", line), line


def test_the_command_keeps_openblas_to_one_thread_unless_told() -> None:
    # eva makes no BLAS call; NumPy's OpenBLAS threads only took CPU from the video checks
    code = "import os, eva.cli, numpy; print(os.environ['OPENBLAS_NUM_THREADS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    env["OPENBLAS_NUM_THREADS"] = "3"  # the user's value wins
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "3"


def _run_eva(args: list[str], prelude: str = "") -> subprocess.CompletedProcess[str]:
    # an atexit handler shows whether the interpreter's teardown ran
    code = (
        "import atexit, sys\n"
        f"{prelude}\n"
        "atexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n"
        f"sys.argv = ['eva', *{args!r}]\n"
        "from eva.cli import run\n"
        "run()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_finished_data_command_exits_at_once_with_its_status_and_output(
    small_dataset: Path, tmp_path: Path
) -> None:
    ok = _run_eva(["info", str(small_dataset), "--json"])
    assert ok.returncode == 0 and "teardown ran" not in ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])  # the whole output, flushed
    bad = _run_eva(["validate", str(tmp_path)])
    assert bad.returncode == 1 and "teardown ran" not in bad.stderr
    assert "problem(s)" in bad.stderr and "missing" in bad.stdout  # flushed too
    usage = _run_eva(["export", str(small_dataset), "--format", "zip"])
    assert usage.returncode == 2 and "teardown ran" not in usage.stderr


def test_the_interpreter_exits_normally_when_something_may_need_it() -> None:
    import threading

    from eva import cli

    for args in (["--help"], ["upload", "--help"]):  # not a fast-exit command
        done = _run_eva(args)
        assert done.returncode == 0 and "teardown ran" in done.stderr, args
    ran = list(cli.RAN)
    try:
        cli.RAN[:] = ["info"]
        baseline = cli._nothing_left_running()  # (a thread an earlier test left would count)
        release = threading.Event()
        thread = threading.Thread(target=release.wait)  # a thread the exit would join
        thread.start()
        assert not cli._nothing_left_running()
        release.set()
        thread.join()
        assert cli._nothing_left_running() == baseline
        sys.settrace(lambda *a: None)  # a tracer (coverage) writes its data at exit
        try:
            assert not cli._nothing_left_running()
        finally:
            sys.settrace(None)
        assert cli._nothing_left_running() == baseline
    finally:
        cli.RAN[:] = ran
