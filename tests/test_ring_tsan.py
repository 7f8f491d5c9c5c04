"""The native SnapshotRing under ThreadSanitizer (``make tsan``): a producer and a consumer
thread hammer tiny blocks so that every block hand-over and growth path runs; TSan reports any
data race and the ring's debug assertions (on in this build) check the hand-over itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILER = os.environ.get("CXX", "g++")


def _build(tmp_path: Path, sources: list[Path]) -> Path:
    binary = tmp_path / "ring_stress"
    cmd = [COMPILER, "-std=c++17", "-O1", "-g", "-fsanitize=thread", "-ffp-contract=off",
           f"-I{ROOT / 'native'}", *map(str, sources), "-o", str(binary), "-pthread"]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode != 0:
        if "tsan" in built.stderr.lower() or "sanitize" in built.stderr.lower():
            pytest.skip(
                f"{COMPILER} cannot link ThreadSanitizer here: {built.stderr.strip()[:200]}"
            )
        raise AssertionError(built.stderr)
    return binary


def _run(binary: Path, pushes: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    return subprocess.run(
        [str(binary), str(pushes)], capture_output=True, text=True, env=env, timeout=300
    )


pytestmark = [
    # the C++ ring itself, compiled here: no reference runs, so the pure-Python pass leaves it out
    pytest.mark.native,
    pytest.mark.skipif(shutil.which(COMPILER) is None, reason=f"no {COMPILER}"),
]


def test_ring_has_no_data_race(tmp_path: Path) -> None:
    binary = _build(tmp_path, [ROOT / "native" / "ring.cpp", ROOT / "native/tests/ring_stress.cpp"])
    result = _run(binary, 100_000)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ring_stress:") == 3


def test_the_stress_test_catches_a_missing_release(tmp_path: Path) -> None:
    """Proof that the test can fail: the producer's publishing store weakened to relaxed."""
    source = (ROOT / "native" / "ring.cpp").read_text()
    publish = "tb->tail.store(tail + 1, std::memory_order_release);"
    assert publish in source
    broken = tmp_path / "ring_broken.cpp"
    broken.write_text(source.replace(publish, publish.replace("release", "relaxed")))
    binary = _build(tmp_path, [broken, ROOT / "native/tests/ring_stress.cpp"])
    result = _run(binary, 50_000)
    assert result.returncode == 66, result.stdout + result.stderr[-2000:]
    assert "ThreadSanitizer: data race" in result.stderr
