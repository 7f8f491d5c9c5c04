"""Shared fixtures for the whole suite (keep them cheap: tiny frames, few episodes).

* ``lerobot_fixture_dir``: the committed LeRobot-0.3.3-written v2.1 dataset (read only!).
* ``synthetic_dataset``: factory ``synthetic_dataset(name="raw", **kwargs) -> Path`` writing a raw
  v2.1 dataset under ``tmp_path`` through the real writer; kwargs go to
  ``eva.capture.synthetic.write_synthetic_dataset`` (episodes, frames, cameras, width, height,
  fps, quality, quality_issues, qc_verdicts, qc_notes, tasks, extra_rows, seed, chunks_size...).
  Calling it twice with the same name appends to the same dataset.
* ``qc_failed_dataset``: ``P`` of the hostile-dataset tests (3 episodes, episode 1 QC-failed).
* ``small_dataset``: a ready 3-episode dataset (green / red+pass / red), 1 camera 64x48, 12-16
  frames each, at ``tmp_path / "raw"``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eva import _native
from eva.capture.synthetic import write_synthetic_dataset

# Every kernel in eva_fast; the native pass must have all of them, or it would silently test the
# references twice (tests of a native variant skip only when EVA_PUREPYTHON=1 asks for that).
NATIVE_KERNELS = (
    "_buildinfo",
    "stats",
    "ring",
    "shm_ring",
    "align",
    "rgb",
    "msgpack_image",
    "float_repr",
)


def pytest_sessionstart(session: pytest.Session) -> None:
    if _native.pure_python_forced():
        return
    missing = []
    for name in NATIVE_KERNELS:
        try:
            _native.load(name)
        except _native.NativeCoreError:
            missing.append(name)
    if missing:
        pytest.exit(
            f"native core incomplete: eva_fast.{', eva_fast.'.join(missing)} not importable "
            "(run `make build`, or set EVA_PUREPYTHON=1 to test the references)",
            returncode=1,
        )


def _is_native_variant(item: pytest.Item) -> bool:
    """A test of the native kernel itself: marked `native`, or a `native*` parametrization."""
    if item.get_closest_marker("native"):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    return any(part == "native" or part.startswith("native_") for part in callspec.id.split("-"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under EVA_PUREPYTHON=1 the native variants are deselected, not skipped: they ran in the
    native pass, and this pass checks that the references alone carry the whole suite."""
    if not _native.pure_python_forced():
        return
    native = [item for item in items if _is_native_variant(item)]
    if native:
        config.hook.pytest_deselected(items=native)
        items[:] = [item for item in items if not _is_native_variant(item)]


FIXTURES = Path(__file__).parent / "fixtures"
LEROBOT_V21_FIXTURE = FIXTURES / "lerobot_v21_fixture"


@pytest.fixture
def lerobot_fixture_dir() -> Path:
    return LEROBOT_V21_FIXTURE


@pytest.fixture
def synthetic_dataset(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str = "raw", **kwargs: Any) -> Path:
        return write_synthetic_dataset(tmp_path / name, **kwargs)

    return make


@pytest.fixture
def qc_failed_dataset(synthetic_dataset: Callable[..., Path]) -> Path:
    """``P`` of the hostile-dataset tests: 3 episodes (12, 16, 14 frames, a 4-value state),
    episode 1 QC-failed, episode 2 red with a pass verdict, two tasks."""
    return synthetic_dataset(
        episodes=3,
        frames=[12, 16, 14],
        state_dim=4,
        quality=["green", "green", "red"],
        qc_verdicts=[None, "fail", "pass"],
        tasks=["a", "b"],
    )


@pytest.fixture
def small_dataset(synthetic_dataset: Callable[..., Path]) -> Path:
    return synthetic_dataset(
        episodes=3,
        frames=[12, 16, 14],
        quality=["green", "red", "red"],
        qc_verdicts=[None, "pass", None],
        tasks=["pick the red cube", "place it in the bin"],
    )
