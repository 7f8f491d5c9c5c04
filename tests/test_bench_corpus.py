"""The bench corpus generator (bench/corpus.py) writes valid v2.1 datasets with the promised
encodings: B-frames in ``high``, none in ``eva``, AV1 in ``av1``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import av
import pytest

from eva.dataset.validate import validate_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpus  # noqa: E402

TINY = corpus.CorpusParams(episodes=2, frames=30, cameras=1, width=128, height=96)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def _generate(name: str, cache: Path) -> tuple[Path, dict]:
    raw = corpus.ensure_corpus(name, TINY, root=cache, workers=1, log=False)
    return raw, corpus.summary(name, raw)


def test_eva_corpus_is_valid_and_has_no_b_frames(cache: Path) -> None:
    raw, facts = _generate("eva", cache)
    assert validate_dataset(raw) == []
    assert facts["episodes"] == 2 and facts["frames"] == 60 and facts["videos"] == 2
    assert facts["codec"] == ["h264"] and not facts["b_frames"]
    assert facts["keyframes_per_video"] == [1, 1]  # GOP 30 over 30 frames
    assert corpus.check("eva", facts) == []


def test_high_corpus_is_valid_with_b_frames(cache: Path) -> None:
    raw, facts = _generate("high", cache)
    assert validate_dataset(raw) == []
    assert facts["codec"] == ["h264"] and facts["profile"] == ["High"]
    assert facts["all_b_frames"]
    assert corpus.check("high", facts) == []
    # The same content as the eva corpus: the parquet files are copied, not regenerated.
    eva_raw = corpus.corpus_dir("eva", TINY, cache) / "raw"
    for table in eva_raw.rglob("*.parquet"):
        assert (raw / table.relative_to(eva_raw)).read_bytes() == table.read_bytes()


@pytest.mark.skipif("libsvtav1" not in av.codecs_available, reason="PyAV has no libsvtav1 encoder")
def test_av1_corpus_is_valid_av1(cache: Path) -> None:
    raw, facts = _generate("av1", cache)
    assert validate_dataset(raw) == []
    info = json.loads((raw / "meta" / "info.json").read_text())
    key = corpus.camera_keys(TINY)[0]
    assert info["features"][key]["info"]["video.codec"] == "av1"
    assert corpus.check("av1", facts) == []
    # LeRobot's g=2: a keyframe every other frame.
    assert facts["keyframes_mean"] >= TINY.frames / 2 - 1


def test_cached_corpus_is_reused_and_no_temp_dir_left(cache: Path) -> None:
    first = corpus.ensure_corpus("eva", TINY, root=cache, log=False)
    mtime = (first / "meta" / "info.json").stat().st_mtime_ns
    again = corpus.ensure_corpus("eva", TINY, root=cache, log=False)
    assert again == first and (again / "meta" / "info.json").stat().st_mtime_ns == mtime
    assert not list(cache.glob(".tmp-*"))


def test_params_hash_names_the_corpus() -> None:
    other = corpus.CorpusParams(episodes=3, frames=30, cameras=1, width=128, height=96)
    assert corpus.corpus_dir("high", TINY).name != corpus.corpus_dir("high", other).name
    assert corpus.corpus_dir("high", TINY).name.startswith("high-")


def test_command_line_defaults_to_every_corpus_and_refuses_unknown_names() -> None:
    assert corpus.parse_args([]).names == list(corpus.CORPUS_NAMES)
    assert corpus.parse_args(["--episodes", "4", "high"]).names == ["high"]
    with pytest.raises(SystemExit) as exit_info:
        corpus.parse_args(["high", "h264"])
    assert exit_info.value.code == 2
