"""The HDF5 format's tasks, by layout (``Hdf5Options.layout``): eva's own (``writer.TASKS``),
aloha (an episode file each) and robomimic (a demo part each, assembled into ``data.hdf5`` by the
subset's finish). One ``TaskFormat`` that hands each call to its layout's, and
``check_source``: what a layout refuses of a source, before anything is written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eva.dataset import embedded
from eva.dataset.mp4box import Mp4Error, read_video_samples
from eva.dataset.reader import DatasetReader
from eva.dataset.subset import SubsetMeta
from eva.formats._decode import VideoOpenError, open_video
from eva.formats.base import ExportOptions, OptionError
from eva.formats.hdf5 import robomimic, writer
from eva.formats.hdf5.items import FORMAT_NAME
from eva.formats.hdf5.names import layout_names
from eva.formats.hdf5.renumber import renumber_episode
from eva.formats.hdf5.trainer import (
    ALOHA_PATH,
    TrainerEpisodeSession,
    aloha_path,
    demo_part_path,
)
from eva.formats.options import Hdf5Options
from eva.formats.tasks import (
    EpisodeFormat,
    EpisodeResult,
    EpisodeTask,
    EpisodeWriterSession,
    SerialWrite,
)
from eva.progress import ProgressSink


def layout_info(source_info: Mapping[str, Any], data_path: str) -> dict[str, Any]:
    """A trainer layout's info.json: embedded images, ``data_path`` naming its files (which is
    how ``verify`` tells the layouts apart)."""
    return embedded.embedded_images_info(
        source_info, dataset_format=FORMAT_NAME, data_path=data_path
    )


ALOHA = EpisodeFormat(
    path=aloha_path,
    label="{subset} episode {index} (source episode {source_index})",
    open_episode_writer=TrainerEpisodeSession,
    check_options=lambda options: options.format_options(Hdf5Options),
    subset_info=lambda meta, options: layout_info(meta.info, ALOHA_PATH),
)
ROBOMIMIC = EpisodeFormat(
    path=demo_part_path,
    label="{subset} demo {index} (source episode {source_index})",
    open_episode_writer=TrainerEpisodeSession,
    check_options=lambda options: options.format_options(Hdf5Options),
    subset_info=lambda meta, options: layout_info(meta.info, robomimic.DATA_FILE),
)
LAYOUTS = {"eva": writer.TASKS, "aloha": ALOHA, "robomimic": ROBOMIMIC}


def layout_of(options: ExportOptions) -> EpisodeFormat:
    return LAYOUTS[options.format_options(Hdf5Options).layout]


def renumber(
    reader: DatasetReader, task: EpisodeTask, previous: EpisodeTask, published: Path
) -> EpisodeResult | None:
    """eva's layout patches a renumbered episode's file; the trainer layouts write it anew."""
    if layout_of(task.options) is not writer.TASKS:
        return None
    return renumber_episode(reader, task, previous, published)


class Hdf5Tasks(SerialWrite):
    """The HDF5 format's ``TASKS``: each call goes to the layout its options name."""

    pool_from_cores = writer.TASKS.pool_from_cores
    serial_threads = writer.TASKS.serial_threads
    renumber = staticmethod(renumber)

    def subset_tasks(
        self, reader: DatasetReader, meta: SubsetMeta, subset_dir: Path, options: ExportOptions
    ) -> list[EpisodeTask]:
        return layout_of(options).subset_tasks(reader, meta, subset_dir, options)

    def open_episode_writer(
        self, reader: DatasetReader, options: ExportOptions
    ) -> EpisodeWriterSession[EpisodeTask]:
        return layout_of(options).open_episode_writer(reader, options)

    def reused_result(self, task: EpisodeTask, entry: Mapping[str, object]) -> EpisodeResult:
        return EpisodeResult.from_record(task, entry)

    def finish_subset(
        self,
        meta: SubsetMeta,
        subset_dir: Path,
        results: Sequence[EpisodeResult],
        progress: ProgressSink,
        options: ExportOptions,
    ) -> None:
        """The layout's finish; robomimic first assembles ``data.hdf5`` from the parts."""
        opts = options.format_options(Hdf5Options)
        if opts.layout == "robomimic":
            size = robomimic.assemble(meta, subset_dir, results, opts)
            progress(files=1, bytes=size, current=f"{meta.subset}/{robomimic.DATA_FILE}")
        layout_of(options).finish_subset(meta, subset_dir, results, progress, options)


def check_source(
    reader: DatasetReader, metas: Mapping[str, SubsetMeta], options: ExportOptions
) -> None:
    """Before anything is written: a trainer layout's names for the source's features
    (``--hdf5-map`` naming no feature, two features given one name) and one frame shape per
    camera over the exported episodes (the trainers stack frames across episodes). An
    ``OptionError`` naming the feature."""
    opts = options.format_options(Hdf5Options)
    if opts.layout == "eva":
        return
    layout_names(opts.layout, reader.features, reader.video_keys, opts.feature_map)
    episodes = sorted({src for meta in metas.values() for src in meta.source_episode_indices})
    for key in reader.video_keys:
        first: tuple[int, tuple[int, int]] | None = None
        for src in episodes:
            shape = _frame_shape(reader, src, key)
            if shape is None:
                continue
            if first is None:
                first = (src, shape)
            elif shape != first[1]:
                raise OptionError(
                    "hdf5_layout",
                    f"{key}: source episode {src} frames are {shape[1]}x{shape[0]}, episode "
                    f"{first[0]}'s {first[1][1]}x{first[1][0]}: {opts.layout} needs one frame "
                    "shape per camera",
                )


def _frame_shape(reader: DatasetReader, src: int, key: str) -> tuple[int, int] | None:
    """(height, width) of an episode's camera from its sample entry (else FFmpeg's stream);
    None when neither can tell (the writer's decode then refuses the file)."""
    try:
        entry = read_video_samples(reader.video_file(src, key)).entry
        return entry.height, entry.width
    except (Mp4Error, OSError):
        pass
    try:
        container, stream = open_video(reader.video_file(src, key))
    except VideoOpenError:
        return None
    try:
        return int(stream.codec_context.height), int(stream.codec_context.width)
    finally:
        container.close()
