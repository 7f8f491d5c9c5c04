"""Metadata of one quality subset (accepted or rejected) and the column-wise index rewrite.

A subset is a self-consistent dataset cut out of a source (docs/formats.md, "Accepted and rejected"): its episodes are
renumbered from 0 in source order, ``index`` becomes contiguous over the subset, ``task_index``
points into the subset's own task table, and every other column / episodes.jsonl field is kept.
Everything here works on plain dicts and arrow tables, so every format module can share it:

- ``build_subset_meta(...)`` -> ``SubsetMeta`` (renumbered rows, task table and remap, renumbered
  per-episode stats, merged stats, v2.1 info with subset totals);
- ``build_subset_meta(..., edits=, kept_stats=)`` applies the operator's edits
  (``SplitPlan.edits``) once for every format (``eva.dataset.subset_edits``): a trimmed
  episode's length is its kept frames', its stats and pixel histograms are ``kept_stats[src]``
  (computed over the kept frames by the caller, ``eva.export.source.kept_frame_stats``), an
  edited task joins the subset's task table; the exported row holds the edited ``length`` and
  ``tasks`` and no ``edit_*`` field (the subset's ``quality_split.json`` records the edits);
- ``rewrite_index_columns(table, episode_index, index_offset, task_remap)``: pyarrow compute, no
  per-row Python;
- ``write_common_meta(dest, meta, info)``: info.json, episodes.jsonl, episodes_stats.jsonl,
  tasks.jsonl, stats.json of the subset, and eva's ``eva_image_histograms.jsonl`` sidecar
  (renumbered) when the source has it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from eva.dataset import layout
from eva.dataset.atomic import json_file_bytes, jsonl_bytes
from eva.dataset.edits import EDIT_FIELDS, EpisodeEdits
from eva.dataset.errors import DatasetError, naming_write_errors
from eva.dataset.subset_edits import edited_task_table

Stats = dict[str, dict[str, list[Any]]]
# An edited episode's stats over its kept frames and its cameras' pixel histograms (the
# caller computes them: eva.export.source)
KeptStats = tuple["Stats", dict[str, np.ndarray]]


@dataclass
class SubsetMeta:
    """Everything a format writer needs to know about one subset, before touching any data.

    Lists are in output order: output episode ``i`` is source episode ``source_episode_indices[i]``,
    its rows get ``index`` values ``index_offsets[i] .. index_offsets[i] + lengths[i] - 1``.
    """

    subset: str
    source_episode_indices: list[int]
    episodes: list[dict[str, Any]]
    lengths: list[int]
    index_offsets: list[int]
    tasks: dict[int, str]
    task_remap: dict[int, int]
    episodes_stats: dict[int, Stats]
    stats: Stats
    info: dict[str, Any]
    video_keys: list[str] = field(default_factory=list)
    # output episode -> {video_key: (3, 256) pixel counts} from the source's sidecar, for the
    # episodes that have one (eva-written sources; empty for LeRobot-written ones)
    image_histograms: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    # the operator's edits (eva.dataset.subset_edits), per output episode: its kept raw frames
    # [start, end) (None: every frame) and, for an edited task, its own task remap
    trims: dict[int, tuple[int, int]] = field(default_factory=dict)
    source_lengths: dict[int, int] = field(default_factory=dict)  # the trimmed ones' recorded
    episode_task_remaps: dict[int, dict[int, int]] = field(default_factory=dict)

    def trim_of(self, output_episode: int) -> tuple[int, int] | None:
        """The raw frames ``[start, end)`` output episode keeps (None: all of them)."""
        return self.trims.get(output_episode)

    def task_remap_of(self, output_episode: int) -> dict[int, int]:
        """Source task index -> subset task index for the episode's rows (an edited task
        maps every source task to the edited string's index)."""
        return self.episode_task_remaps.get(output_episode, self.task_remap)

    def has_all_image_histograms(self) -> bool:
        """True when every episode has a recorded histogram for every camera (exact quantiles)."""
        return all(
            set(self.video_keys) <= set(self.image_histograms.get(ep, {}))
            for ep in range(self.total_episodes)
        )

    @property
    def total_episodes(self) -> int:
        return len(self.source_episode_indices)

    @property
    def total_frames(self) -> int:
        return int(sum(self.lengths))

    def source_index(self, output_episode: int) -> int:
        return self.source_episode_indices[output_episode]


def _constant_stats(value: float, n: int) -> dict[str, list[Any]]:
    return {"min": [value], "max": [value], "mean": [float(value)], "std": [0.0], "count": [n]}


def _range_stats(start: int, n: int) -> dict[str, list[Any]]:
    # Stats of start, start+1, ..., start+n-1 (population std of a contiguous range).
    return {
        "min": [start],
        "max": [start + n - 1],
        "mean": [start + (n - 1) / 2.0],
        "std": [math.sqrt((n * n - 1) / 12.0)],
        "count": [n],
    }


def _array_stats(values: np.ndarray) -> dict[str, list[Any]]:
    as_float = values.astype(np.float64)
    return {
        "min": [int(values.min())],
        "max": [int(values.max())],
        "mean": [float(as_float.mean())],
        "std": [float(as_float.std())],
        "count": [int(values.size)],
    }


def _remap_values(values: np.ndarray, remap: Mapping[int, int]) -> np.ndarray:
    """Map every value through ``remap`` (all values must be keys) without a per-row loop."""
    keys = np.array(sorted(remap), dtype=np.int64)
    targets = np.array([remap[int(k)] for k in keys], dtype=np.int64)
    return targets[np.searchsorted(keys, values)]


def _ordered_unique(values: np.ndarray) -> list[int]:
    """Unique values in order of first appearance (vectorised)."""
    if values.size == 0:
        return []
    uniq, first = np.unique(values, return_index=True)
    return [int(v) for v in uniq[np.argsort(first, kind="stable")]]


def _task_remap(
    source_indices: Sequence[int],
    source_tasks: Mapping[int, str],
    task_index_values: Mapping[int, np.ndarray],
) -> dict[int, int]:
    """Source task index -> subset task index: the subset's tasks numbered in order of first
    use over its episodes."""
    task_remap: dict[int, int] = {}
    for src in source_indices:
        for old in _ordered_unique(np.asarray(task_index_values[src])):
            if old not in task_remap:
                if old not in source_tasks:
                    raise DatasetError(
                        f"{layout.TASKS}: episode {src}: task_index {old} has no task entry"
                    )
                task_remap[old] = len(task_remap)
    return task_remap


def renumbered_stats(
    source_stats: Mapping[str, Any],
    new: int,
    offset: int,
    length: int,
    task_values: np.ndarray,
    task_remap: Mapping[int, int],
) -> Stats:
    """An episode's stats as subset episode ``new`` whose rows start at global index ``offset``:
    its episode_index, index and task_index stats follow the renumbering."""
    ep_stats = dict(source_stats)
    if "episode_index" in ep_stats:
        ep_stats["episode_index"] = _constant_stats(new, length)
    if "index" in ep_stats:
        ep_stats["index"] = _range_stats(offset, length)
    if "task_index" in ep_stats and task_values.size:
        ep_stats["task_index"] = _array_stats(_remap_values(task_values, task_remap))
    return ep_stats


def subset_info(
    source_info: Mapping[str, Any], n: int, frames: int, tasks: int, video_keys: list[str]
) -> dict[str, Any]:
    """The source's info.json with the subset's totals (``n`` episodes)."""
    info = copy.deepcopy(dict(source_info))
    chunks_size = int(info.get("chunks_size", layout.DEFAULT_CHUNKS_SIZE))
    info["total_episodes"] = n
    info["total_frames"] = frames
    info["total_tasks"] = tasks
    info["total_videos"] = n * len(video_keys)
    info["total_chunks"] = (n + chunks_size - 1) // chunks_size if n else 0
    info["splits"] = {"train": f"0:{n}"} if n else {}
    return info


def build_subset_meta(
    subset: str,
    *,
    source_info: Mapping[str, Any],
    source_episodes: Mapping[int, Mapping[str, Any]],
    source_tasks: Mapping[int, str],
    source_episodes_stats: Mapping[int, Stats],
    source_indices: Sequence[int],
    task_index_values: Mapping[int, np.ndarray],
    merge: Any = None,
    source_image_histograms: Mapping[int, Mapping[str, np.ndarray]] | None = None,
    edits: Mapping[int, EpisodeEdits] | None = None,
    kept_stats: Mapping[int, KeptStats] | None = None,
) -> SubsetMeta:
    """Describe the subset made of ``source_indices`` (in that order) of a v2.1 source.

    ``source_episodes`` maps source episode index -> its episodes.jsonl row; ``task_index_values``
    maps source episode index -> that episode's ``task_index`` column (used for the task remap and
    the renumbered ``task_index`` stats); ``source_episodes_stats`` must hold complete per-episode
    stats (the caller fills features missing there from the table). ``merge`` is the stats merge
    function (defaults to ``eva.dataset.stats.merge_stats``). ``source_image_histograms`` maps
    source episode index -> its recorded pixel histograms (``DatasetReader.all_image_histograms``).
    ``edits`` (source index -> its edits) and ``kept_stats``: see the module doc.
    """
    if merge is None:
        from eva.dataset.stats_merge import merge_stats as merge

    source_indices = [int(i) for i in source_indices]
    edits = _applied_edits(edits or {}, source_indices, source_episodes, task_index_values)
    task_remap, tasks, episode_remaps, task_index_values = _task_table(
        source_indices, source_tasks, task_index_values, edits
    )

    episodes: list[dict[str, Any]] = []
    lengths: list[int] = []
    offsets: list[int] = []
    episodes_stats: dict[int, Stats] = {}
    image_histograms: dict[int, dict[str, np.ndarray]] = {}
    offset = 0
    for new, src in enumerate(source_indices):
        row, length = _exported_row(
            source_episodes[src], len(task_index_values[src]), edits.get(src)
        )
        source_stats = source_episodes_stats.get(src, {})
        histograms = (source_image_histograms or {}).get(src)
        if src in edits and edits[src].trim is not None:
            source_stats, histograms = (kept_stats or {})[src]
        row["episode_index"] = new
        episodes.append(row)
        lengths.append(length)
        offsets.append(offset)
        task_values = np.asarray(task_index_values[src], dtype=np.int64)
        remap = episode_remaps.get(src, task_remap)
        episodes_stats[new] = renumbered_stats(
            source_stats, new, offset, length, task_values, remap
        )
        if histograms:
            image_histograms[new] = dict(histograms)
        offset += length

    stats: Stats = merge(list(episodes_stats.values())) if episodes else {}
    video_keys = [
        k for k, f in source_info.get("features", {}).items() if f.get("dtype") == "video"
    ]
    info = subset_info(source_info, len(source_indices), int(sum(lengths)), len(tasks), video_keys)
    return SubsetMeta(
        subset=subset,
        source_episode_indices=source_indices,
        episodes=episodes,
        lengths=lengths,
        index_offsets=offsets,
        tasks=tasks,
        task_remap=task_remap,
        episodes_stats=episodes_stats,
        stats=stats,
        info=info,
        video_keys=video_keys,
        image_histograms=image_histograms,
        **_edit_fields(source_indices, source_episodes, edits, episode_remaps),
    )


def _task_table(
    source_indices: Sequence[int],
    source_tasks: Mapping[int, str],
    task_index_values: Mapping[int, np.ndarray],
    edits: Mapping[int, EpisodeEdits],
) -> tuple[dict[int, int], dict[int, str], dict[int, dict[int, int]], Mapping[int, np.ndarray]]:
    """The subset's task remap and table, the edited-task episodes' own remaps (by source
    index) and each episode's ``task_index`` values of its kept rows."""
    if not edits:
        task_remap = _task_remap(source_indices, source_tasks, task_index_values)
        return (
            task_remap,
            {new: source_tasks[old] for old, new in task_remap.items()},
            {},
            task_index_values,
        )
    kept_values = {src: _kept(task_index_values[src], edits.get(src)) for src in source_indices}
    used = {src: _ordered_unique(v) for src, v in kept_values.items()}
    task_remap, tasks, episode_remaps = edited_task_table(source_indices, source_tasks, used, edits)
    return task_remap, tasks, episode_remaps, kept_values


def _edit_fields(
    source_indices: Sequence[int],
    source_episodes: Mapping[int, Mapping[str, Any]],
    edits: Mapping[int, EpisodeEdits],
    episode_remaps: Mapping[int, dict[int, int]],
) -> dict[str, Any]:
    """``SubsetMeta``'s fields of the edits, by output episode: trims, the trimmed episodes'
    recorded lengths and the edited tasks' remaps."""
    trims: dict[int, tuple[int, int]] = {}
    source_lengths: dict[int, int] = {}
    for new, src in enumerate(source_indices):
        trim = edits[src].trim if src in edits else None
        if trim is not None:
            trims[new] = trim
            source_lengths[new] = int(source_episodes[src].get("length", trim[1]))
    remaps = {
        new: dict(episode_remaps[src])
        for new, src in enumerate(source_indices)
        if src in episode_remaps
    }
    return {"trims": trims, "source_lengths": source_lengths, "episode_task_remaps": remaps}


def _applied_edits(
    edits: Mapping[int, EpisodeEdits],
    source_indices: Sequence[int],
    source_episodes: Mapping[int, Mapping[str, Any]],
    task_index_values: Mapping[int, np.ndarray],
) -> dict[int, EpisodeEdits]:
    """The subset's episodes' edits that change something: a trim that keeps every frame is
    none (the episode is exported as it would be without it)."""
    applied: dict[int, EpisodeEdits] = {}
    for src in source_indices:
        edit = edits.get(src)
        if edit is None:
            continue
        length = int(source_episodes[src].get("length", len(task_index_values[src])))
        if edit.trim is not None and not edit.cuts(length):
            edit = dataclasses.replace(edit, trim=None)
        if edit.trim is not None or edit.task is not None:
            applied[src] = edit
    return applied


def _kept(values: Any, edit: EpisodeEdits | None) -> np.ndarray:
    """An episode's ``task_index`` values of its kept rows."""
    array: np.ndarray = np.asarray(values)
    if edit is None or edit.trim is None:
        return array
    return array[edit.trim[0] : edit.trim[1]]


def _exported_row(
    source_row: Mapping[str, Any], rows: int, edit: EpisodeEdits | None
) -> tuple[dict[str, Any], int]:
    """An episodes.jsonl row as exported, and its length (its ``length``, else its ``rows``).
    Edited, its length is the kept frames' and its ``tasks`` the edited task; the edits are
    applied (quality_split.json records them), so the row keeps no ``edit_*`` field."""
    # Shallow copies: only top-level keys are replaced, nested values are written unchanged.
    row = dict(source_row)
    length = int(row.get("length", rows))
    if edit is None:
        return row, length
    for key in EDIT_FIELDS:
        row.pop(key, None)
    if edit.trim is not None:
        length = edit.kept_length(length)
        row["length"] = length
    if edit.task is not None:
        recorded = row.get("tasks")
        row["tasks"] = edit.tasks(recorded if isinstance(recorded, list) else [])
    return row, length


def _replace_column(table: pa.Table, name: str, values: np.ndarray) -> pa.Table:
    """``table`` with column ``name`` holding ``values`` (int64), in the field's own type."""
    pos = table.schema.get_field_index(name)
    old_field = table.schema.field(pos)
    type_ = old_field.type
    if pa.types.is_integer(type_) and type_ != pa.int64():
        # numpy's cast, after the range check Arrow's safe cast would make (whose call
        # imports pyarrow.compute)
        limits = np.iinfo(np.dtype(type_.to_pandas_dtype()))
        if len(values) == 0 or (limits.min <= values.min() and values.max() <= limits.max):
            values = values.astype(limits.dtype)
    array = arrow_array(values)
    if array.type != type_:
        array = array.cast(type_)
    return table.set_column(pos, old_field, array)


def arrow_array(values: np.ndarray, type_: pa.DataType | None = None) -> pa.Array:
    """A 1-D numpy array of a fixed-width number type as an arrow array sharing its buffer.
    ``pa.array(ndarray)`` checks for numpy masked arrays, which imports ``numpy.ma`` on first use
    (~35 ms of every export's start-up)."""
    values = np.ascontiguousarray(values)
    if type_ is None:
        type_ = pa.from_numpy_dtype(values.dtype)
    if values.ndim != 1 or values.dtype != np.dtype(type_.to_pandas_dtype()):
        return pa.array(values, type=type_)
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def rewrite_index_columns(
    table: pa.Table,
    episode_index: int,
    index_offset: int,
    task_remap: Mapping[int, int],
    *,
    where: str | None = None,
) -> pa.Table:
    """Return ``table`` with ``episode_index``, ``index`` and ``task_index`` renumbered.

    Column-wise (numpy); field types and schema metadata are kept. A ``task_index``
    value missing from ``task_remap`` raises ``DatasetError``, whose message starts with ``where``
    (the caller's source file and episode; by default the output episode).
    """
    where = where or f"episode {episode_index}"
    n = table.num_rows
    for name in ("episode_index", "index"):
        if table.schema.get_field_index(name) < 0:
            raise DatasetError(f"{where}: table has no {name!r} column")
    table = _replace_column(table, "episode_index", np.full(n, episode_index, dtype=np.int64))
    table = _replace_column(
        table, "index", np.arange(index_offset, index_offset + n, dtype=np.int64)
    )
    if table.schema.get_field_index("task_index") >= 0:
        column = table.column("task_index")
        if column.null_count:
            raise DatasetError(f"{where}: task_index None is not in the subset task table")
        old = column.to_numpy().astype(np.int64, copy=False)
        keys = np.array(sorted(task_remap), dtype=np.int64)
        values = np.array([task_remap[k] for k in keys.tolist()], dtype=np.int64)
        positions = np.searchsorted(keys, old).clip(0, max(len(keys) - 1, 0))
        unknown = np.flatnonzero(keys[positions] != old) if len(keys) else np.arange(len(old))
        if len(unknown):
            bad = int(old[unknown[0]])
            raise DatasetError(f"{where}: task_index {bad} is not in the subset task table")
        table = _replace_column(table, "task_index", values[positions])
    return table


def write_common_meta(dest: Path, meta: SubsetMeta, info: Mapping[str, Any]) -> int:
    """Write the subset's common metadata under ``dest/meta`` (info as given: formats adapt it);
    returns how many files that was (for progress).

    ``dest`` is a staging directory: nothing in it is visible before publication swaps it in as a
    whole (after one ``syncfs`` when durable), so its files are written in place, without the
    temporary-file-and-rename (and without per-file fsyncs) that a visible file would need.
    """
    dest = Path(dest)
    (dest / layout.META_DIR).mkdir(parents=True, exist_ok=True)
    jsonl_files: dict[str, Iterable[Any]] = {
        layout.EPISODES: meta.episodes,
        layout.TASKS: ({"task_index": i, "task": t} for i, t in sorted(meta.tasks.items())),
        layout.EPISODES_STATS: (
            {"episode_index": i, "stats": s} for i, s in sorted(meta.episodes_stats.items())
        ),
    }
    if meta.image_histograms:
        jsonl_files[layout.IMAGE_HISTOGRAMS] = (
            {"episode_index": i, "histograms": {k: h.tolist() for k, h in hists.items()}}
            for i, hists in sorted(meta.image_histograms.items())
        )
    json_files = {layout.INFO: dict(info), layout.STATS: meta.stats}
    for rel, obj in json_files.items():
        write_staged_json(dest / rel, obj)
    for rel, rows in jsonl_files.items():
        data = jsonl_bytes(dest / rel, rows)
        with naming_write_errors(dest / rel):
            (dest / rel).write_bytes(data)
    return len(json_files) + len(jsonl_files)


def write_staged_json(path: Path, obj: Any) -> None:
    """A JSON file inside a staging directory (same text as ``atomic_write_json``), written in
    place: see ``write_common_meta``."""
    data = json_file_bytes(path, obj)
    with naming_write_errors(path):  # a full disk names the file
        Path(path).write_bytes(data)
