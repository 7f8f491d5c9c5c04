"""What every format's ``verify`` shares: the problem collector and the checks worded once.

The collector is the validator's (``eva.dataset.validate.problems``): a format's verify calls it
with a problem's code, message, file and episode, and the message gets the file (and episode) in
front, which is what the CLI prints. The shared checks: info.json's version and totals against
what the files hold, and the real read of one state, one action and one image frame per episode
(each format reads them with its own reader and hands the values here). A format's verifier
adds only what is particular to its layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from eva.dataset import layout
from eva.dataset.validate.problems import ProblemCollector as ProblemCollector

# The vector features whose first value every verifier reads back.
VECTOR_FEATURES = (layout.STATE, layout.ACTION)


def check_unreadable_meta(add: ProblemCollector, root: Path, error: BaseException) -> None:
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    add("unreadable_meta", f"cannot read metadata: {line}", root / layout.META_DIR)


def check_version(
    add: ProblemCollector, info: Mapping[str, object], version: str, path: Path
) -> None:
    if info.get("codebase_version") != version:
        add("wrong_version", f"codebase_version {info.get('codebase_version')!r}", path)


def check_total(
    add: ProblemCollector,
    info: Mapping[str, object],
    key: str,
    counted: int,
    what: str,
    path: Path,
) -> None:
    """info.json's ``key`` against ``counted`` (``what``: the count in words, e.g. "3 rows")."""
    if info.get(key) != counted:
        add(key, f"info {key} {info.get(key)} but {what}", path)


def check_vectors(
    add: ProblemCollector,
    features: Mapping[str, Mapping[str, object]],
    first_values: Mapping[str, np.ndarray | None],
    path: Path,
    episode: int,
) -> None:
    """The real read of one state and one action: ``first_values[name]`` is the first row's
    value as the format's reader gave it (None: no such column). A declared feature must be
    there, with as many values as info.json's shape says."""
    for name in VECTOR_FEATURES:
        if name not in features:
            continue
        value = first_values.get(name)
        if value is None:
            add("missing_column", f"column {name!r} missing", path, episode)
            continue
        shape = features[name].get("shape")
        declared = tuple(shape) if isinstance(shape, list | tuple) else value.shape
        if value.size != int(np.prod(declared)) or value.ndim > len(declared):
            add(
                "bad_value",
                f"{name} has shape {value.shape}, info declares {declared}",
                path,
                episode,
            )


def check_frame(
    add: ProblemCollector,
    camera: str,
    frame: np.ndarray | None,
    expected: tuple[int, ...],
    path: Path,
    episode: int,
) -> None:
    """The real read of one image frame: it decoded, with info.json's (H, W, 3) shape."""
    if frame is None or frame.shape != expected:
        got = None if frame is None else frame.shape
        add("bad_frame", f"camera {camera!r}: frame {got}, expected {expected}", path, episode)
