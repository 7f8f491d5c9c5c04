"""HDF5 export: one file per episode with ``columns``, ``images`` and ``metadata`` groups (the
``eva`` layout, below); ``--hdf5-layout aloha|robomimic`` writes the trainers' layouts instead
(``trainer``, ``robomimic``, names in ``names``; dispatch and source checks in ``layouts``).

Layout: ``data/chunk-XXX/episode_NNNNNN.hdf5``. Each top-level group is a mapping
stored as ``item_NNNNNN`` sub-groups, each holding a dataset ``value`` and the attributes ``key``
(the original key, which may contain "/" or ".") and ``kind``:

- ``array``: a numeric or bool ndarray or scalar (0-d). A Python ``int``/``float``/``bool`` also
  carries ``python_type`` so it reads back as the same Python type;
- ``string``: UTF-8 variable-length string;
- ``bytes``: 1-D uint8;
- ``none``: an empty uint8 array standing for ``None``;
- ``msgpack``: 1-D uint8 holding MessagePack (docs/formats.md, "MessagePack") of a mapping, list, tuple, or an array
  numpy/HDF5 cannot store natively (strings, objects, complex). Tuples read back as lists.

``columns`` holds every Parquet column (float32 stays float32, fixed-size lists become (n, dim)),
``images`` one (T, H, W, 3) uint8 dataset per camera, chunked along the frame axis and appendable
(maxshape (None, H, W, 3)), ``metadata`` the episodes.jsonl row plus ``fps``.

Speed: the export should run at about the speed of decoding the source videos. Each camera is
decoded with PyAV codec threading, in a decode thread, into one of two reused batch buffers while
this thread writes the other one's chunk-sized slices with direct chunk writes (no per-frame resize
or write, never a whole episode in memory: two batches of at most 32 MiB each). When the
native core is built, frames are converted to RGB by libswscale straight into that buffer
(``eva.dataset.rgb.FrameConverter``), so pixels are identical to
``frame.to_ndarray(format="rgb24")``; a self-check on each video's first frame falls back to
PyAV's conversion and a copy for that video if they ever differ.

Options: ``Hdf5Options`` (``eva.formats.options``). Frames per chunk (``hdf5_frames_per_chunk``): a chunk is the unit HDF5 reads, writes and
compresses. One frame per chunk gives the cheapest random access (reading frame i touches exactly
one frame) and the smallest write buffer; larger chunks (e.g. 8-32 frames) read sequential clips
with fewer I/O calls and compress better (gzip/lzf see more similar data at once), but reading a
single frame then reads and decompresses the whole chunk.

Compression (``hdf5_compression``: ``none`` | ``gzip[:level]`` | ``lzf``): raw
chunks are written directly and run at disk/page-cache speed; gzip and lzf shrink files but cost
roughly 50-60 MB/s per core, an order of magnitude slower than decoding. gzip chunks are
compressed here with zlib on every core (HDF5's deflate filter stores exactly a zlib stream) and
written as already-filtered direct chunks; lzf datasets are written one whole-chunk block at a time
through HDF5's own filter pipeline. Compression applies to image and column arrays (not to scalar
or metadata items). Frames come from lossy H.264, so compression only trades CPU for disk.
"""

from eva.dataset.columns import column_values as column_value  # the `columns` group's values
from eva.dataset.rgb import (  # re-exported: hdf5.<name> is used by tests and benches
    FrameConverter,
    pack_frame,
    pack_frame_reference,
)
from eva.formats.hdf5.items import (
    EPISODE_PATH,
    FORMAT_NAME,
    GROUPS,
    ITEM_NAME,
    KINDS,
    decode_item,
    encode_value,
    iter_items,
    read_mapping,
    write_item,
    write_mapping,
)
from eva.formats.hdf5.layouts import Hdf5Tasks, check_source
from eva.formats.hdf5.reader import Hdf5Episode, read_episode
from eva.formats.hdf5.verify import verify
from eva.formats.hdf5.writer import (
    BatchBuffers,
    EpisodeWriter,
    Hdf5EpisodeSession,
    ImageWriteStats,
    episode_path,
    export_info,
)
from eva.formats.options import MAX_BATCH_BYTES, Hdf5Options, parse_compression

# The subset as one task per episode file, in the layout the options name.
TASKS = Hdf5Tasks()
write_subset = TASKS.write_subset

__all__ = [
    "TASKS",
    "EPISODE_PATH",
    "FORMAT_NAME",
    "GROUPS",
    "ITEM_NAME",
    "KINDS",
    "MAX_BATCH_BYTES",
    "BatchBuffers",
    "EpisodeWriter",
    "FrameConverter",
    "Hdf5Episode",
    "Hdf5EpisodeSession",
    "Hdf5Tasks",
    "Hdf5Options",
    "ImageWriteStats",
    "check_source",
    "column_value",
    "decode_item",
    "encode_value",
    "episode_path",
    "export_info",
    "iter_items",
    "pack_frame",
    "pack_frame_reference",
    "parse_compression",
    "read_episode",
    "read_mapping",
    "verify",
    "write_item",
    "write_mapping",
    "write_subset",
]
