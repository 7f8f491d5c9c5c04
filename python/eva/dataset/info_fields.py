"""The info.json fields every reader of a v2.1 dataset relies on, checked once as it is read
(``DatasetReader.info``), by the validator and by the export verifiers."""

from __future__ import annotations

from typing import Any

from eva.dataset.limits import MAX_FPS

__all__ = ["info_field_problems"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def info_field_problems(info: dict[str, Any]) -> list[str]:
    """Every info.json field that readers rely on and that is unusable, as ``field ...: why``.

    Checked here, once, so that no reader entry point meets them as a traceback later: fps is
    a whole number in 1..MAX_FPS (``int(fps)`` of 0.5 would divide by zero), ``chunks_size`` a
    positive integer (it names the ``chunk-NNN`` directories), ``total_*`` integers >= 0 and
    every feature an object with a string ``dtype`` and a list of positive integers as ``shape``.
    """
    problems: list[str] = []
    fps = info.get("fps")
    if not isinstance(fps, int | float) or isinstance(fps, bool) or not 0 < fps <= MAX_FPS:
        problems.append(f"field 'fps' {fps!r} is not a number in 1..{MAX_FPS}")
    elif not float(fps).is_integer():
        problems.append(f"field 'fps' {fps!r} is not a whole number of frames per second")
    chunks_size = info.get("chunks_size")
    if chunks_size is not None and (not _is_int(chunks_size) or chunks_size < 1):
        problems.append(f"field 'chunks_size' {chunks_size!r} is not an integer >= 1")
    for key, value in info.items():
        if key.startswith("total_") and (not _is_int(value) or value < 0):
            problems.append(f"field {key!r} {value!r} is not an integer >= 0")
    features = info.get("features")
    if not isinstance(features, dict):
        problems.append("field 'features' missing or not an object")
        return problems
    for key, feature in features.items():
        if not isinstance(feature, dict):
            problems.append(f"feature {key!r} is not an object")
            continue
        if not isinstance(feature.get("dtype"), str):
            problems.append(f"feature {key!r}: dtype {feature.get('dtype')!r} is not a string")
        shape = feature.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d > 0 for d in shape):
            problems.append(f"feature {key!r}: shape {shape!r} is not a list of integers >= 1")
    return problems
