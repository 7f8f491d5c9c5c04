"""The ``jsonl`` format: ``data/episode_NNNNNN.jsonl`` per episode (its rows, renumbered: one
JSON object a line, the vectors as lists), plus the common metadata; ``verify`` reads every
file back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from eva.dataset import layout
from eva.dataset.atomic import read_json_object, read_jsonl
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta
from eva.dataset.validate import Problem
from eva.formats.base import ExportOptions
from eva.formats.tasks import EpisodeFormat, EpisodeResult, EpisodeTask
from jsonl_format.entry import JsonlOptions

NAME = "jsonl"
DATA_PATH = "data/episode_{episode_index:06d}.jsonl"
COLUMNS = ("frame_index", "timestamp", layout.STATE, layout.ACTION)


class JsonlSession:
    """Writes one episode's file a task (``eva.formats.tasks.EpisodeWriterSession``)."""

    def __init__(self, reader: DatasetReader, options: ExportOptions) -> None:
        self.reader = reader
        self.sort_keys = options.format_options(JsonlOptions).sort_keys

    def write(self, task: EpisodeTask) -> EpisodeResult:
        table = self.reader.read_table(task.source_index).select(list(COLUMNS))
        path = task.subset_dir / task.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as out:
            for number, row in enumerate(table.to_pylist()):
                row.update(episode_index=task.index, index=task.index_offset + number)
                out.write(json.dumps(row, sort_keys=self.sort_keys) + "\n")
        size = path.stat().st_size
        return EpisodeResult(task.subset, task.index, task.path, size, f"{task.subset}/{task.path}")

    def close(self) -> None:
        pass


def subset_info(meta: SubsetMeta, options: ExportOptions) -> Mapping[str, object]:
    info = {k: v for k, v in meta.info.items() if k != "video_path"}
    features = {k: f for k, f in meta.info["features"].items() if f.get("dtype") != "video"}
    return {**info, "features": features, "dataset_format": NAME, "data_path": DATA_PATH}


TASKS = EpisodeFormat(
    path=lambda index, _chunks_size: DATA_PATH.format(episode_index=index),
    label="episode {index} (source episode {source_index})",
    open_episode_writer=JsonlSession,
    check_options=lambda options: options.format_options(JsonlOptions),
    subset_info=subset_info,
)
write_subset = TASKS.write_subset


def verify(export_dir: Path) -> list[Problem]:
    """Every episode's file holds its ``length`` rows, numbered as episodes.jsonl says."""
    root = Path(export_dir)
    problems: list[Problem] = []
    info = read_json_object(root / layout.INFO)
    if info.get("dataset_format") != NAME:
        path = str(root / layout.INFO)
        problems.append(Problem("wrong_format", f"{path}: not {NAME}", path, None))
    for row in read_jsonl(root / layout.EPISODES):
        episode = int(row["episode_index"])
        path = root / DATA_PATH.format(episode_index=episode)
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        if len(lines) != row["length"] or any(r["episode_index"] != episode for r in lines):
            message = f"{path}: {len(lines)} rows of episode {episode}, expected {row['length']}"
            problems.append(Problem("rows", message, str(path), episode))
    return problems
