"""LeRobot v3.0 export: sharded Parquet tables and packet-copied MP4 shards.

Layout written into the staging directory::

    data/chunk-XXX/file-YYY.parquet              rows of consecutive episodes, in ``index`` order
    videos/<key>/chunk-XXX/file-YYY.mp4          that camera's episodes back to back
    meta/episodes/chunk-000/file-000.parquet     one row per episode: locators + stats/<f>/<s>
    meta/tasks.parquet                           task text as the pandas index, task_index column
    meta/info.json, stats.json                   v3.0 info; stats with q01..q99
    meta/episodes.jsonl, tasks.jsonl, episodes_stats.jsonl   kept from the v2.1 subset

Sharding is planned in the driver from the source files before anything is written
(``plan``), so the files are the same whichever executor writes them:

* Data: a file takes consecutive episodes while their source parquet files together stay within
  ``data_files_size_in_mb`` (LeRobot's own converter measures the source files too), and only
  episodes of one schema. Its rows are buffered (bounded by that size) and written with one
  ``write_table`` (one pass, big row groups).
* Video, per camera: a file takes consecutive episodes of one data file while their source MP4s
  together stay within ``video_files_size_in_mb``, and only episodes whose stream parameters
  (codec, size, pix_fmt, time base, extradata) are compatible. Differing parameters start a new
  file, never a re-encode: LeRobot addresses the video file per episode, so a new file is free,
  while a re-encode would change the pixels and cost two orders of magnitude more time.
* ``file_index`` counts to ``chunks_size - 1`` and then wraps to 0 in the next chunk folder.

Each file is one task (``shard_tasks``: ``eva.formats.tasks.TaskFormat``, the package's
``TASKS``), run by the export's executor; the driver merges their results (``writer``): the
episode rows with their stats, the image histograms, and the dataset-wide quantiles (vectors
read back from the data files, so no task sends its rows' values to the driver).

Frame counts: before copying, the MP4's own sample count must equal the episode's rows; while
copying, the packets are counted (one MP4 video sample = one frame, so no decode is needed). With
``verify_decode`` every finished shard is decoded and its frames bucketed per episode by
timestamp. Any mismatch raises ``DatasetError`` naming episode and camera; the pipeline then
discards the staging directory, so nothing is published.

Quantiles (``stats.json`` and the per-episode ``stats/<feature>/q..`` columns): vector features are
exact (numpy ``linear`` quantiles over every row; the numeric columns are collected in their own
dtype for that, about 150 bytes per row for two 14-dim float32 vectors plus the bookkeeping
columns). Image features come from exact 256-bin per-channel histograms, per episode and summed
over the subset:

* Recorded by eva (the default for eva-written sources): when every exported episode has its
  cameras' histograms in the source's ``meta/eva_image_histograms.jsonl`` (the raw writer records
  them in the same pass as the image mean/std), those are used and nothing is decoded. They count
  the frames as given to the writer, before encoding, exactly like the image mean/std (and like
  LeRobot's own stats, computed from the frames passed to ``add_frame``), so every image stat of a
  feature describes the same pixels; the quantiles equal ``np.quantile`` over all those pixels.
  This holds with ``verify_decode`` too (it still decodes every frame, to count them).
* Otherwise (LeRobot-written or partly eva-written sources) they are sampled: an exact histogram
  of the frames that are decoded, by default a bounded sample of keyframes, whose packets the copy
  keeps on the way and worker threads decode (no seek, no second read; decoding, conversion and
  the histogram kernel release the GIL, so it overlaps the copy). The bound: at most
  ``image_quantile_keyframes`` keyframes per episode and camera (default 1: the episode's middle
  keyframe; with k, keyframe ``(2j + 1) * m // 2k`` of its m, j < k; 0 takes every keyframe, i.e.
  every GOP-th frame), so at most k x episodes x cameras frames are decoded whatever the episode
  length. Decoding a keyframe costs more than copying a whole episode's packets (1-2 ms at
  320x240), so the sample is what keeps the export at packet-copy speed. That is a systematic
  sample like LeRobot's own (it samples frames evenly too): the quantiles are exact for the
  sampled frames, and their deviation from the all-frames value is a sampling error, not a
  worst-case bound (on the 50-episode bench dataset: within 0.008 on the 0..1 scale with the
  middle keyframe, 0.012 with every keyframe). With ``verify_decode`` every frame is decoded
  anyway and these quantiles are exact over the decoded pixels (equal to numpy's ``np.quantile``
  on all of them within 1e-12).

Options: ``LeRobotV3Options`` (``eva.formats.options``; CLI ``eva export --format v3``), whose
fields have the names info.json uses: ``data_files_size_in_mb``, ``video_files_size_in_mb``,
``chunks_size``, ``verify_decode``, ``image_quantiles`` ("keyframes", or "none" to skip the
keyframe sample: image features then get no quantiles unless ``verify_decode`` decodes every
frame anyway or histograms were recorded) and ``image_quantile_keyframes`` (0 = every keyframe).

An empty subset is a complete dataset with zero-row, schema-only Parquet files (no row group).
LeRobot 0.4.4 itself cannot open a zero-episode dataset (HF datasets refuses an empty split), so
``make compat`` checks empty subsets with ``eva verify``.
"""

from eva.formats._decode import decode_frame_times, decode_frames
from eva.formats.lerobot_v3.mux import (
    AppendedEpisode,
    VideoShardWriter,
    decode_keyframes,
    spread_sample,
)
from eva.formats.lerobot_v3.shards import column_matrix
from eva.formats.lerobot_v3.tables import (
    CODEBASE_VERSION,
    DATA_PATH,
    DATASET_FORMAT,
    EPISODES_PATH,
    TASKS_PARQUET,
    VIDEO_PATH,
    episodes_table,
    next_file,
    tasks_table,
    v3_info,
)
from eva.formats.lerobot_v3.verify import TIMESTAMP_TOLERANCE_S, read_episode_locators, verify
from eva.formats.lerobot_v3.video import (
    EpisodeVideo,
    EpisodeVideoInfo,
    ParamsCache,
    StreamParams,
    VideoConcatError,
    probe,
)
from eva.formats.lerobot_v3.writer import TASKS, write_subset
from eva.formats.options import LeRobotV3Options

__all__ = [
    "TASKS",
    "CODEBASE_VERSION",
    "DATASET_FORMAT",
    "DATA_PATH",
    "EPISODES_PATH",
    "TASKS_PARQUET",
    "TIMESTAMP_TOLERANCE_S",
    "VIDEO_PATH",
    "AppendedEpisode",
    "EpisodeVideo",
    "EpisodeVideoInfo",
    "LeRobotV3Options",
    "ParamsCache",
    "StreamParams",
    "VideoConcatError",
    "VideoShardWriter",
    "column_matrix",
    "decode_frame_times",
    "decode_frames",
    "decode_keyframes",
    "episodes_table",
    "next_file",
    "probe",
    "read_episode_locators",
    "spread_sample",
    "tasks_table",
    "v3_info",
    "verify",
    "write_subset",
]
