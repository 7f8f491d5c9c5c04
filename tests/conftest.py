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

import importlib
from collections.abc import Callable, Iterator
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
    "mcap_chunk",
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


def _runs_in_native_pass_only(item: pytest.Item) -> bool:
    return _is_native_variant(item) or item.get_closest_marker("kernel_independent") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under EVA_PUREPYTHON=1 the native variants are deselected, not skipped: they ran in the
    native pass, and this pass checks that the references alone carry the whole suite. So are
    the ``kernel_independent`` tests: nothing they run depends on the switch, so this pass would
    repeat the native one exactly."""
    if not _native.pure_python_forced():
        return
    native_only = [item for item in items if _runs_in_native_pass_only(item)]
    if native_only:
        config.hook.pytest_deselected(items=native_only)
        items[:] = [item for item in items if not _runs_in_native_pass_only(item)]


# Every place where eva reaches a native kernel: the modules that take one from
# ``eva._native.load`` (at import, or per call through their ``load``), and ``load`` itself (stats,
# ``eva --version``). tests/test_native_switch.py checks that none is missing.
KERNEL_SWITCHES = (
    ("eva._native", "load"),
    ("eva.capture.align", "load"),
    ("eva.capture.ring", "load"),
    ("eva.capture.shm_ring", "load"),
    ("eva.dataset.rgb", "_native"),
    ("eva.dataset.msgpack_codec", "_native"),
    ("eva.formats.mcap.json_rows", "_native"),
    ("eva.formats.mcap.records", "_native"),
    ("eva.formats.mcap.h264", "_native"),
    ("eva.formats.mcap.frame_records", "_native"),
)


class _KernelTripwire:
    """Stands in for a kernel switch during a ``kernel_independent`` test: any use is recorded
    (and raises, unless something swallows it: the record fails the test all the same)."""

    def __init__(self, switch: str, used: list[str]) -> None:
        self._switch = switch
        self._used = used

    def _trip(self, what: str) -> AssertionError:
        self._used.append(what)
        return AssertionError(f"a kernel_independent test reached a native kernel: {what}")

    def __getattr__(self, name: str) -> Any:
        raise self._trip(f"{self._switch}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._trip(f"{self._switch}({', '.join(map(repr, args))})")


@pytest.fixture(autouse=True)
def _kernel_independence(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``kernel_independent`` test (and its function-scoped fixtures) runs with every kernel
    switch replaced by a tripwire: the mark's promise, that the pure-Python pass may leave the
    test out, is checked wherever the test runs (in the native pass)."""
    if request.node.get_closest_marker("kernel_independent") is None:
        yield
        return
    used: list[str] = []
    # imported first: a kernel module's import takes its kernel from ``load``
    modules = [importlib.import_module(module_name) for module_name, _ in KERNEL_SWITCHES]
    with pytest.MonkeyPatch.context() as patch:
        for module, (module_name, name) in zip(modules, KERNEL_SWITCHES, strict=True):
            patch.setattr(module, name, _KernelTripwire(f"{module_name}.{name}", used))
        yield
    assert not used, f"marked kernel_independent, yet reached a native kernel: {used}"


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
