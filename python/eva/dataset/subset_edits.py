"""The operator's edits (``eva.dataset.edits``) as a subset applies them, once for every format.

``build_subset_meta`` (``eva.dataset.subset``) describes each exported episode after its edits:
its kept length, index offset, task and trim; the formats then cut rows and frames with what is
here, so every format keeps the same frames:

- ``trim_table(table, trim, fps, where)``: the kept rows ``[start, end)`` of an episode's table,
  ``frame_index`` from 0 and ``timestamp`` from 0 (the global ``index`` is the subset's
  renumbering, ``rewrite_index_columns``);
- ``edited_task_table(...)``: the subset's task table when some episodes have an edited task:
  the edited string joins the subset's ``tasks.jsonl`` (the raw one is never touched), sharing
  the index of an equal string; such an episode's rows all point at it;
- ``kept_frames(batches, trim)``: a camera's decoded batches cut to the kept frames.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from eva.dataset import layout
from eva.dataset.edits import EpisodeEdits
from eva.dataset.errors import DatasetError

Trim = tuple[int, int]


def trim_table(table: pa.Table, trim: Trim | None, fps: float | None, where: str) -> pa.Table:
    """The rows ``[start, end)`` of an episode's table, ``frame_index`` and ``timestamp``
    restarting at 0; ``table`` itself without a trim. A timestamp column on the recorder's grid
    (``frame_index / fps`` in its own type) stays on it; any other is shifted by its first kept
    value. ``DatasetError`` (``where``: the file and episode) for a trim past the table's rows."""
    if trim is None:
        return table
    start, end = trim
    if not 0 <= start < end <= table.num_rows:
        raise DatasetError(
            f"{where}: trim [{start}, {end}) is not inside the table's {table.num_rows} rows"
        )
    kept = table.slice(start, end - start)
    n = kept.num_rows
    frame_index = np.arange(n, dtype=np.int64)
    if "frame_index" in kept.column_names:
        kept = _set_column(kept, "frame_index", frame_index)
    if "timestamp" in kept.column_names:
        kept = _set_column(kept, "timestamp", _shifted_times(table, start, end, frame_index, fps))
    return kept


def _shifted_times(
    table: pa.Table, start: int, end: int, kept_index: np.ndarray, fps: float | None
) -> np.ndarray:
    column = table.column("timestamp").combine_chunks()
    times = column.to_numpy(zero_copy_only=False)
    dtype = times.dtype
    if fps and "frame_index" in table.column_names:
        recorded = table.column("frame_index").to_numpy().astype(np.float64)
        if np.array_equal(times, (recorded / fps).astype(dtype)):
            return np.asarray((kept_index / fps).astype(dtype))
    part = times[start:end].astype(np.float64)
    return np.asarray((part - part[0]).astype(dtype))


def _set_column(table: pa.Table, name: str, values: np.ndarray) -> pa.Table:
    pos = table.schema.get_field_index(name)
    field = table.schema.field(pos)
    array = pa.array(values)
    if array.type != field.type:
        array = array.cast(field.type)
    return table.set_column(pos, field, array)


def kept_frames(batches: Iterator[np.ndarray], trim: Trim | None) -> Iterator[np.ndarray]:
    """A camera's decoded (n, H, W, 3) batches cut to the frames ``[start, end)`` (views of
    the same batches); every batch without a trim. Frames past ``end`` are not decoded."""
    if trim is None:
        yield from batches
        return
    start, end = trim
    position = 0
    for batch in batches:
        first, last = max(start - position, 0), min(end - position, len(batch))
        position += len(batch)
        if first < last:
            yield batch[first:last]
        if position >= end:
            return


def edited_task_table(
    source_indices: Sequence[int],
    source_tasks: Mapping[int, str],
    used: Mapping[int, Sequence[int]],
    edits: Mapping[int, EpisodeEdits],
) -> tuple[dict[int, int], dict[int, str], dict[int, dict[int, int]]]:
    """The subset's tasks, numbered in order of first use over its episodes: ``(task_remap,
    tasks, episode_remaps)``. ``used``: each source episode's task indices in order of first
    use over its kept rows; an episode with an edited task uses that string instead, and its
    ``episode_remaps[src]`` maps every source task index to it. A source task keeps its own
    index (as without edits); an edited string equal to a task already numbered shares its
    index."""
    task_remap: dict[int, int] = {}
    tasks: dict[int, str] = {}
    by_text: dict[str, int] = {}
    edited_texts: set[str] = set()
    episode_remaps: dict[int, dict[int, int]] = {}
    for src in source_indices:
        edit = edits.get(src)
        if edit is not None and edit.task is not None:
            text = edit.task
            if text not in by_text:
                by_text[text] = len(tasks)
                tasks[by_text[text]] = text
                edited_texts.add(text)
            episode_remaps[src] = dict.fromkeys(source_tasks, by_text[text])
            continue
        for old in used[src]:
            if old in task_remap:
                continue
            if old not in source_tasks:
                raise DatasetError(
                    f"{layout.TASKS}: episode {src}: task_index {old} has no task entry"
                )
            text = source_tasks[old]
            if text in edited_texts:
                task_remap[old] = by_text[text]
                continue
            task_remap[old] = len(tasks)
            tasks[task_remap[old]] = text
            by_text.setdefault(text, task_remap[old])
    return task_remap, tasks, episode_remaps
