"""The built wheel, as a user installs it: `make wheel` (manylinux, the native core compiled in),
installed with its dependencies into a fresh venv, reads and verifies every export format, with
the native core and with the numpy references (EVA_PUREPYTHON=1)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from eva.export.pipeline import export_dataset

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("lerobot_v21", "lerobot_v3", "hdf5", "mcap")

pytestmark = [
    pytest.mark.slow,
    # the test runs both backends itself, inside the fresh venv
    pytest.mark.skipif(os.environ.get("EVA_PUREPYTHON") == "1", reason="runs in the native pass"),
]

READ_EACH_FORMAT = """
import json, sys
from pathlib import Path
import eva, eva_fast
from eva.formats import catalog
from eva._native import build_info
print(json.dumps({"eva": eva.__file__, "backend": build_info()["backend"]}))
for fmt in sys.argv[2:]:
    for subset in ("accepted", "rejected"):
        problems = catalog.parse(fmt).load().verify(Path(sys.argv[1]) / fmt / subset)
        assert not problems, (fmt, subset, problems)
"""


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{cmd}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
    return result


def test_wheel_installs_and_reads_every_format(tmp_path: Path, small_dataset: Path) -> None:
    built = _run(["make", "-s", "-C", str(ROOT), "wheel"])
    wheels = sorted((ROOT / "dist").glob("eva-*-manylinux*.whl"), key=lambda p: p.stat().st_mtime)
    assert wheels, built.stdout
    # the console page ships whole: its modules sit in subfolders of static/
    static = ROOT / "python" / "eva" / "console" / "static"
    page = {f"eva/console/static/{p.relative_to(static)}" for p in static.rglob("*") if p.is_file()}
    with zipfile.ZipFile(wheels[-1]) as wheel:
        assert page <= set(wheel.namelist()), page - set(wheel.namelist())
    venv = tmp_path / "venv"
    # Installed by this environment's pip (`pip --python`), without bytecode: bootstrapping a
    # pip into the fresh venv (ensurepip) and compiling every dependency's modules took half of
    # the test, and neither is eva's.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile"]
    _run([*pip, str(wheels[-1])])
    for fmt in FORMATS:
        export_dataset(small_dataset, fmt)
    exports = small_dataset.parent / "export"
    # outside the checkout, so that nothing imports the source tree instead of the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVA_PUREPYTHON")}
    for pure in ("", "1"):
        out = _run(
            [str(python), "-c", READ_EACH_FORMAT, str(exports), *FORMATS],
            cwd=tmp_path,
            env={**env, "EVA_PUREPYTHON": pure} if pure else env,
        )
        assert str(venv) in out.stdout, out.stdout  # the installed package, not the checkout
        assert ('"reference' in out.stdout) == bool(pure), out.stdout
    cli = _run(
        [str(venv / "bin" / "eva"), "info", str(exports / "hdf5" / "accepted")], cwd=tmp_path
    )
    assert "hdf5" in cli.stdout + cli.stderr
