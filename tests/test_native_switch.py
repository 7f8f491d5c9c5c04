"""The switch between the native core and the numpy references: EVA_PUREPYTHON=1 selects the
references, and nothing else does."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import KERNEL_SWITCHES

from eva.capture.synthetic import write_synthetic_dataset

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "eva"


def test_a_broken_native_core_is_an_error_not_a_silent_fallback(tmp_path: Path) -> None:
    """A wheel whose compiled modules do not import (here: every eva_fast module but _buildinfo
    blocked, as a missing shared library would) must not run the slow references unasked: one line naming the module
    and the way out; EVA_PUREPYTHON=1 is the only switch to the references."""
    root = tmp_path / "raw"
    write_synthetic_dataset(root, episodes=1, frames=12, seed=0)
    blocker = (
        "import sys\n"
        "class Broken:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('eva_fast.') and name != 'eva_fast._buildinfo':\n"
        "            raise ImportError('libeva_native.so: cannot open shared object file')\n"
        "sys.meta_path.insert(0, Broken())\n"
        "from eva.cli import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "EVA_PUREPYTHON"}
    broken = subprocess.run(
        [sys.executable, "-c", blocker, "export", str(root), "--format", "hdf5"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert broken.returncode == 1, broken.stderr
    lines = broken.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not import" in lines[0] and "eva_fast." in lines[0], (
        broken.stderr
    )
    assert "EVA_PUREPYTHON=1" in lines[0] and "cannot open shared object" in lines[0]
    assert not (tmp_path / "export").exists()
    version = subprocess.run(
        [sys.executable, "-c", blocker, "--version"], capture_output=True, text=True, env=env
    )
    assert version.returncode == 0 and "core: native" in version.stdout  # _buildinfo imports
    forced = subprocess.run(
        [sys.executable, "-c", blocker, "export", str(root), "--format", "hdf5"],
        capture_output=True, text=True, env={**env, "EVA_PUREPYTHON": "1"},
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr


@pytest.mark.kernel_independent
def test_the_kernel_independent_tripwire_covers_every_switch() -> None:
    """conftest's KERNEL_SWITCHES is every name through which eva reaches a native kernel: the
    ``load`` of a module that calls it per use, the module-level name it assigns ``load(...)``
    to otherwise, and ``eva._native.load`` itself. A new switch missing from it would let a
    ``kernel_independent`` test use a kernel unnoticed (and then skip it in the pure pass)."""
    found = {("eva._native", "load")}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = any(
            isinstance(node, ast.ImportFrom)
            and node.module == "eva._native"
            and any(alias.name == "load" for alias in node.names)
            for node in tree.body
        )
        if not imported:
            continue
        module = ".".join(("eva", *path.relative_to(PACKAGE).with_suffix("").parts))
        for node in tree.body:  # module level: `name = load("kernel")`
            value = node.value if isinstance(node, ast.Assign) else None
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "load":
                found |= {(module, t.id) for t in node.targets if isinstance(t, ast.Name)}
        in_functions = [
            call
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for call in ast.walk(node)
            if isinstance(call, ast.Name) and call.id == "load"
        ]
        if in_functions:
            found.add((module, "load"))
    assert found == set(KERNEL_SWITCHES)
