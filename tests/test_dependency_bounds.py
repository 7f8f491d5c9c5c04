"""The libraries whose internals or exact output eva relies on are bounded below their next
major release, in pyproject.toml and in the Makefile's install alike, and the installed release
lies inside the bound (the canaries vouch for that release only).

A failure here names the library: run its canary (pyproject.toml's comment lists them) against
the new release, adapt eva if it fails, then move the bound in both places.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.kernel_independent

ROOT = Path(__file__).resolve().parent.parent
# distribution -> the canary that vouches for the installed release
BOUNDED = {
    "av": "tests/test_mp4_canary.py",
    "mcap": "tests/test_mcap_canary.py",
    "paramiko": "tests/test_upload_paramiko_compat.py",
    "pyarrow": "tests/test_golden_exports.py",
    "h5py": "tests/test_golden_exports.py",
}


def _requirement(name: str) -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [r for r in dependencies if re.match(rf"{re.escape(name)}\s*[<>=!~]", r)]
    assert len(found) == 1, f"pyproject.toml lists {name} {len(found)} times"
    return str(found[0])


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_bounded_below_the_next_major_release(name: str) -> None:
    requirement = _requirement(name)
    lower = re.search(r">=\s*([\d.]+)", requirement)
    upper = re.search(r"<\s*([\d.]+)", requirement)
    assert lower is not None and upper is not None, f"{requirement}: {name} needs both bounds"
    assert _release(upper.group(1))[1:] in ((), (0,), (0, 0)), (
        f"{requirement}: bound {name} below a major release (the canary covers the whole major)"
    )
    installed = version(name)
    assert _release(lower.group(1)) <= _release(installed) < _release(upper.group(1)), (
        f"{name} {installed} is installed outside {requirement!r}: run {BOUNDED[name]} with it, "
        "then move the bound in pyproject.toml and the Makefile"
    )


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_the_makefile_installs_the_same_bound(name: str) -> None:
    requirement = _requirement(name)
    assert f'"{requirement}"' in (ROOT / "Makefile").read_text(), (
        f"the Makefile's install does not carry pyproject.toml's {requirement!r}"
    )
