"""Zarr export: one Zarr (format v2) store per subset, in the layout diffusion_policy's and
UMI's ``ReplayBuffer`` read (docs/formats.md, "zarr").

``<subset>/replay_buffer.zarr``:

- ``data/<camera>``: ``(N, H, W, 3)`` uint8, one frame per chunk (``--zarr-image-compressor``:
  raw, or Blosc/zstd at ``--zarr-compression-level``);
- ``data/<feature>``: every numeric feature (``observation.state``, ``action``, ...) as
  ``(N, *shape)`` float32;
- ``data/timestamp`` (float32), ``data/episode_index`` and ``data/task_index`` (int64), ``(N,)``;
- ``meta/episode_ends``: int64, the cumulative ends of the episodes (``N`` = the last one);
- the root's attributes: ``eva`` (the subset, fps, source episode indices, tasks and each
  episode's episodes.jsonl row: verdict, note, quality issues, tasks).

Every array holds the subset's episodes in output order, concatenated. Beside the store, the
subset's ``meta/`` (info.json with ``dataset_format: "zarr"`` and ``data_path`` naming the
store, episodes.jsonl, tasks.jsonl, stats; ``quality_split.json``) as for every format.

The store is written by one writer per subset (``TASKS`` is None): its arrays run over every
episode of the subset. Memory: one decode batch per camera shape and one chunk per vector array,
whatever the subset's length. Needs the ``zarr`` extra (zarr 2.x and numcodecs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import zarr as _zarr  # noqa: F401 - the extra's presence, checked when the format loads
except ModuleNotFoundError as e:
    if e.name not in ("zarr", "numcodecs"):
        raise
    raise ImportError("needs the zarr extra (pip install 'eva[zarr]': zarr 2.x)") from None

from eva.dataset import embedded
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta, write_common_meta
from eva.formats.base import ExportOptions
from eva.formats.options import ZarrOptions
from eva.formats.tasks import TaskFormat
from eva.formats.zarr.store import STORE, StoreWriter, episode_label, skipped_features
from eva.formats.zarr.verify import verify
from eva.progress import ProgressSink

FORMAT_NAME = "zarr"
# One writer per subset: the store's arrays run over all of its episodes.
TASKS: TaskFormat[Any] | None = None

__all__ = ["FORMAT_NAME", "STORE", "TASKS", "ZarrOptions", "export_info", "verify", "write_subset"]


def export_info(meta: SubsetMeta) -> dict[str, object]:
    """The subset's info.json: images embedded in the store (``eva.dataset.embedded``)."""
    return embedded.embedded_images_info(meta.info, dataset_format=FORMAT_NAME, data_path=STORE)


def store_attributes(meta: SubsetMeta) -> dict[str, object]:
    """The root's ``eva`` attribute: what the subset is and where its episodes come from."""
    return {
        "eva": {
            "subset": meta.subset,
            "fps": meta.info.get("fps"),
            "source_episode_indices": list(meta.source_episode_indices),
            "tasks": {str(k): v for k, v in meta.tasks.items()},
            "episodes": [dict(row) for row in meta.episodes],
        }
    }


def write_subset(
    reader: DatasetReader,
    meta: SubsetMeta,
    staging_dir: Path,
    progress: ProgressSink,
    options: ExportOptions,
) -> None:
    """The subset's store, episode by episode in output order, then its metadata."""
    opts = options.format_options(ZarrOptions)
    features = meta.info.get("features", {})
    for name in skipped_features(features, meta.video_keys):
        progress(warning=f"{meta.subset}: feature {name}: not numeric, not in the zarr store")
    writer = StoreWriter(reader, meta, Path(staging_dir) / STORE, opts)
    for output in range(meta.total_episodes):
        written = writer.write_episode(output)
        current = f"{meta.subset}/{STORE}: {episode_label(meta, output)}"
        progress(episodes=1, bytes=written, current=current)
    writer.finish(store_attributes(meta))
    progress(files=1)
    progress(files=write_common_meta(Path(staging_dir), meta, export_info(meta)))
