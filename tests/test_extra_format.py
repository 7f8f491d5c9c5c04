"""A format from outside eva is one package plus one catalogue entry: ``jsonl`` (tests/jsonl_format)
is added by ``catalog.register`` in this process, and by an ``eva.formats`` entry point for the
``eva`` CLI and a real console server, and exported, verified, described and cleaned up like the
built-in formats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from console_server import ConsoleServer, wait_job, write_console_config
from jsonl_format.entry import ENTRY, JsonlOptions

from eva.capture.synthetic import write_synthetic_dataset
from eva.cli import main
from eva.export.describe import describe_directory
from eva.export.pipeline import cleanup, export_dataset
from eva.export.verify import verify_export
from eva.formats import catalog
from eva.formats.base import ExportOptions

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def registered() -> Iterator[catalog.FormatEntry]:
    entry = catalog.register(ENTRY)
    try:
        yield entry
    finally:
        catalog.unregister(entry.name)


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_registered_format_exports_verifies_and_cleans_up(
    tmp_path: Path, registered: catalog.FormatEntry
) -> None:
    raw = write_synthetic_dataset(tmp_path / "raw", episodes=3, frames=[6, 7, 8], quality="green")
    assert catalog.parse("JSON_LINES") is registered and "jsonl" in catalog.names()
    options = ExportOptions(format=JsonlOptions(sort_keys=True))
    result = export_dataset(raw, "jsonl", options=options, executor="processes", workers=2)
    assert result.export_root == tmp_path / "export" / "jsonl"
    rows = _rows(result.accepted_dir / "data" / "episode_000002.jsonl")
    assert len(rows) == 8 and list(rows[0]) == sorted(rows[0])
    assert [r["index"] for r in rows] == list(range(13, 21))
    assert verify_export(result.accepted_dir) == []
    summary = describe_directory(result.accepted_dir)
    assert summary["format"] == "jsonl" and summary["staleness"]["stale"] is False
    # the CLI of this process, its --format parsed by the catalogue
    cli = CliRunner().invoke(main, ["export", str(raw), "--format", "json_lines", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output.splitlines()[-1])["format"] == "jsonl"
    assert cleanup(raw, registered) == {"jsonl": []}
    with pytest.raises(ValueError, match="is another format's name"):
        catalog.register(ENTRY)


def test_a_name_or_alias_taken_is_refused() -> None:
    taken = catalog.FormatEntry("hdf5_copy", "nowhere", JsonlOptions, "x", aliases=("h5",))
    with pytest.raises(ValueError, match="'h5' is another format's name"):
        catalog.register(taken)
    with pytest.raises(ValueError, match="format name"):
        catalog.FormatEntry("../up", "nowhere", JsonlOptions, "x")


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A directory holding the distribution metadata of a package declaring the ``jsonl``
    entry point, on PYTHONPATH with tests/ (where its code lives) for every eva subprocess."""
    site = tmp_path / "site"
    info = site / "eva_jsonl_format-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eva-jsonl-format\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[eva.formats]\njsonl = jsonl_format.entry:ENTRY\n")
    path = os.pathsep.join([str(site), str(TESTS), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    return path


def _eva(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eva.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_an_entry_point_format_through_the_cli_and_the_console(
    tmp_path: Path, plugin_path: str
) -> None:
    help_text = _eva("export", "--help").stdout
    assert "jsonl" in help_text and "--jsonl-sort-keys" in help_text
    raw = write_synthetic_dataset(tmp_path / "cli" / "raw", episodes=2, frames=5, quality="green")
    done = _eva("export", str(raw), "--format", "jsonl", "--jsonl-sort-keys")
    assert done.returncode == 0, done.stderr
    accepted = tmp_path / "cli" / "export" / "jsonl" / "accepted"
    assert list(_rows(accepted / "data" / "episode_000000.jsonl")[0]) == sorted(
        _rows(accepted / "data" / "episode_000000.jsonl")[0]
    )
    checked = _eva("verify", str(accepted))
    assert checked.returncode == 0, checked.stdout + checked.stderr

    log_dir = tmp_path / "logs"
    write_synthetic_dataset(log_dir / "pick" / "raw", episodes=2, frames=5, quality="green")
    config = write_console_config(tmp_path / "rig.toml", log_dir)
    with ConsoleServer(config, tmp_path / "token") as console:
        api = console.client()
        exports = api.get("/api/datasets/pick/exports").json()
        assert "jsonl" in exports["formats"]
        assert "jsonl_sort_keys" in [o["name"] for o in exports["options"]["jsonl"]]
        started = api.post(
            "/api/datasets/pick/export",
            json={"format": "JSON_LINES", "options": {"jsonl_sort_keys": True}},
        )
        assert started.status_code == 202, started.text
        job = wait_job(api, started.json()["job_id"])
        assert job["state"] == "completed" and job["format"] == "jsonl", job
        assert job["verify"]["accepted"]["ok"] and job["verify"]["rejected"]["ok"], job
    assert (log_dir / "pick" / "export" / "jsonl" / "accepted" / "data").is_dir()
