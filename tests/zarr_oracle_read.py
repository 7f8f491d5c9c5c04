"""Reads an eva zarr store with a trainer's own reader, in that reader's venv (not eva's), and
saves what it returned to an .npz for the test to compare with the source
(tests/test_zarr_oracles.py, make compat).

Usage:
  zarr_oracle_read.py replay_buffer DIR STORE OUT.npz
      DIR holds diffusion_policy's replay_buffer.py, unmodified; its ReplayBuffer.copy_from_path
      loads STORE into numpy and into a zarr MemoryStore, and get_episode(i) reads every episode
      (both loads must agree).
  zarr_oracle_read.py zarr3 STORE OUT.npz
      zarr 3 opens the v2 store and reads every array and episode_ends.
The .npz holds each data key concatenated over the episodes, plus ``episode_ends``.
"""

from __future__ import annotations

import sys

import numpy as np
import zarr


def replay_buffer(directory: str, store: str) -> dict[str, np.ndarray]:
    sys.path.insert(0, directory)
    from replay_buffer import ReplayBuffer  # diffusion_policy's, copied out of its repository

    loaded = ReplayBuffer.copy_from_path(store)
    compressed = ReplayBuffer.copy_from_path(store, store=zarr.MemoryStore())
    assert loaded.n_episodes == compressed.n_episodes > 0
    parts: dict[str, list[np.ndarray]] = {}
    for index in range(loaded.n_episodes):
        episode = loaded.get_episode(index)
        other = compressed.get_episode(index)
        assert set(episode) == set(other), (set(episode), set(other))
        for key, values in episode.items():
            assert np.array_equal(values, other[key][:]), (index, key)
            parts.setdefault(key, []).append(np.asarray(values))
    out = {key: np.concatenate(values) for key, values in parts.items()}
    out["episode_ends"] = np.asarray(loaded.episode_ends[:])
    return out


def zarr3(store: str) -> dict[str, np.ndarray]:
    assert zarr.__version__.startswith("3."), zarr.__version__
    root = zarr.open_group(store, mode="r", zarr_format=2)
    out = {name: np.asarray(array[:]) for name, array in root["data"].arrays()}
    out["episode_ends"] = np.asarray(root["meta/episode_ends"][:])
    return out


def main(argv: list[str]) -> None:
    if argv[0] == "replay_buffer":
        arrays = replay_buffer(argv[1], argv[2])
    elif argv[0] == "zarr3":
        arrays = zarr3(argv[1])
    else:
        raise SystemExit(f"unknown reader {argv[0]!r}")
    np.savez(argv[-1], **arrays)
    print(f"{argv[0]}: {len(arrays['episode_ends'])} episodes, keys {sorted(arrays)}")


if __name__ == "__main__":
    main(sys.argv[1:])
