"""Choose between a native kernel and its numpy reference.

Every hot kernel lives twice: in ``eva_fast.<name>`` (Cython/C++) and as a plain numpy/Python
reference beside the code that uses it. ``EVA_PUREPYTHON=1`` forces the references everywhere (like
msgpack-python's fallback); a missing native core falls back too, so eva still works from a source
tree that was never compiled, only slower.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def pure_python_forced() -> bool:
    return os.environ.get("EVA_PUREPYTHON", "").strip().lower() not in ("", "0", "false", "no")


def load(name: str) -> ModuleType | None:
    """Return the native module ``eva_fast.<name>``, or None when the reference must be used."""
    if pure_python_forced():
        return None
    try:
        return importlib.import_module(f"eva_fast.{name}")
    except ImportError:
        return None


def backend() -> str:
    """'native' when the compiled core is importable and not disabled, else 'reference'."""
    return "native" if load("_buildinfo") is not None else "reference"


def build_info() -> dict[str, object]:
    mod = load("_buildinfo")
    if mod is None:
        return {"backend": "reference", "forced": pure_python_forced()}
    return {"backend": "native", **mod.build_info()}
