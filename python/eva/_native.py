"""Choose between a native kernel and its numpy reference.

Every hot kernel lives twice: in ``eva_fast.<name>`` (Cython/C++) and as a plain numpy/Python
reference beside the code that uses it. ``EVA_PUREPYTHON=1`` selects the references everywhere
(like msgpack-python's fallback), and it is the only way to: a native module that does not import
(a broken build or wheel, a source tree never compiled) is a ``NativeCoreError`` naming it, not a
silent switch to code several times slower.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def pure_python_forced() -> bool:
    return os.environ.get("EVA_PUREPYTHON", "").strip().lower() not in ("", "0", "false", "no")


class NativeCoreError(ImportError):
    """A module of the compiled core does not import and the references were not asked for."""


def load(name: str) -> ModuleType | None:
    """The native module ``eva_fast.<name>``; None when ``EVA_PUREPYTHON=1`` selects the
    reference. Raises ``NativeCoreError`` when the module does not import."""
    if pure_python_forced():
        return None
    try:
        return importlib.import_module(f"eva_fast.{name}")
    except ImportError as e:
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), repr(e))
        raise NativeCoreError(
            f"eva's native core is broken: eva_fast.{name} does not import ({reason}); rebuild "
            "it (make build, or pip install . with a C++17 compiler), or set EVA_PUREPYTHON=1 "
            "to run the numpy references (slower)"
        ) from e


def backend() -> str:
    """'native', 'reference' (``EVA_PUREPYTHON=1``) or 'broken' (see ``NativeCoreError``)."""
    return str(build_info()["backend"])


def build_info() -> dict[str, object]:
    """What ``eva --version`` reports; never raises."""
    try:
        mod = load("_buildinfo")
    except NativeCoreError as e:
        return {"backend": "broken", "error": str(e)}
    if mod is None:
        return {"backend": "reference", "forced": pure_python_forced()}
    return {"backend": "native", **mod.build_info()}
