"""Reads an eva HDF5 export in a trainer layout with the trainer's own loader, in that loader's
venv (not eva's), and saves what it returned to an .npz for the test to compare with the source
(tests/test_hdf5_oracles.py, make compat).

Usage:
  hdf5_oracle_read.py act DIR SUBSET_DIR EPISODES CAMERAS OUT.npz
      DIR holds ACT's utils.py, unmodified. get_norm_stats(SUBSET_DIR, EPISODES) runs over every
      episode file; EpisodicDataset (identity norm stats, so its values are the file's own) gives
      every frame of every episode: ``np.random.choice`` (which it samples the start frame with)
      answers each frame index in turn.
  hdf5_oracle_read.py robomimic SHIM_DIR DATA_FILE LOW_DIM CAMERAS OUT.npz
      robomimic 0.3.0's FileUtils.get_shape_metadata_from_dataset and SequenceDataset (every demo,
      then the mask/train and mask/valid filter keys) over DATA_FILE; SHIM_DIR holds the
      oracle's torchvision shim (the CPU venv needs it before robomimic's models import).
CAMERAS and LOW_DIM are comma-separated names. The .npz holds, per episode ``e``: ``e<e>/<name>``
arrays of every frame (images as (T, H, W, 3) uint8), plus what each loader reports of the set.
"""

from __future__ import annotations

import sys

import numpy as np


def act(
    directory: str, subset_dir: str, episodes: int, cameras: list[str]
) -> dict[str, np.ndarray]:
    sys.path.insert(0, directory)
    import torch
    import utils  # ACT's, copied out of its repository

    out: dict[str, np.ndarray] = {}
    stats = utils.get_norm_stats(subset_dir, episodes)
    for name in ("qpos_mean", "qpos_std", "action_mean", "action_std"):
        out[f"stats/{name}"] = np.asarray(stats[name])
    identity = {"qpos_mean": 0.0, "qpos_std": 1.0, "action_mean": 0.0, "action_std": 1.0}
    chosen = [0]
    utils.np.random.choice = lambda n: chosen[0]  # the start frame EpisodicDataset samples
    dataset = utils.EpisodicDataset(list(range(episodes)), subset_dir, cameras, identity)
    for episode in range(episodes):
        frames: dict[str, list[np.ndarray]] = {"qpos": [], "action": []}
        length = None
        t = 0
        while length is None or t < length:
            chosen[0] = t
            image, qpos, action, is_pad = dataset[episode]
            length = int(is_pad.shape[0])
            frames["qpos"].append(qpos.numpy())
            # real robot: the actions from frame max(0, t - 1) on ("to make timesteps aligned")
            frames["action"].append(action[0].numpy())
            pixels = torch.einsum("k c h w -> k h w c", image * 255.0).round().to(torch.uint8)
            for k, camera in enumerate(cameras):
                frames.setdefault(camera, []).append(pixels[k].numpy())
            t += 1
        for name, values in frames.items():
            out[f"e{episode}/{name}"] = np.stack(values)
    return out


def robomimic(
    shim: str, data_file: str, low_dim: list[str], cameras: list[str]
) -> dict[str, np.ndarray]:
    sys.path.insert(0, shim)
    import _tv_cpu_shim  # noqa: F401
    import robomimic.utils.file_utils as FileUtils
    import robomimic.utils.obs_utils as ObsUtils
    from robomimic.utils.dataset import SequenceDataset

    ObsUtils.initialize_obs_modality_mapping_from_dict({"low_dim": low_dim, "rgb": cameras})
    keys = [*low_dim, *cameras]
    meta = FileUtils.get_shape_metadata_from_dataset(data_file, all_obs_keys=keys)
    out: dict[str, np.ndarray] = {"ac_dim": np.asarray(meta["ac_dim"])}
    for key in keys:
        out[f"shape/{key}"] = np.asarray(meta["all_shapes"][key])

    def load(mask: str | None) -> SequenceDataset:
        return SequenceDataset(
            hdf5_path=data_file,
            obs_keys=tuple(keys),
            dataset_keys=("actions", "rewards", "dones"),
            load_next_obs=False,
            filter_by_attribute=mask,
        )

    dataset = load(None)
    demos = sorted(dataset.demos, key=lambda d: int(d[5:]))
    for demo in demos:
        start = dataset._demo_id_to_start_indices[demo]
        rows: dict[str, list[np.ndarray]] = {}
        for i in range(dataset._demo_id_to_demo_length[demo]):
            item = dataset[start + i]
            for name in ("actions", "rewards", "dones"):
                rows.setdefault(name, []).append(np.asarray(item[name][0]))
            for key in low_dim:
                rows.setdefault(key, []).append(np.asarray(item["obs"][key][0]))
            for key in cameras:  # the frame as stored; for the network, CHW floats in [0, 1]
                hwc = np.asarray(item["obs"][key][0])
                chw = ObsUtils.process_obs(hwc, obs_key=key)
                assert chw.shape == (3, *hwc.shape[:2]), chw.shape
                back = np.round(np.asarray(chw).transpose(1, 2, 0) * 255.0).astype(np.uint8)
                assert np.array_equal(back, hwc), key
                rows.setdefault(key, []).append(hwc)
        for name, values in rows.items():
            out[f"e{demo[5:]}/{name}"] = np.stack(values)
    for mask in ("train", "valid"):
        try:
            out[f"mask/{mask}"] = np.asarray(sorted(int(d[5:]) for d in load(mask).demos))
        except (ValueError, IndexError):  # an empty filter key: robomimic cannot make a dataset
            out[f"mask/{mask}"] = np.asarray([], dtype=np.int64)
    return out


def main() -> None:
    kind, *args = sys.argv[1:]
    if kind == "act":
        directory, subset_dir, episodes, cameras, out = args
        arrays = act(directory, subset_dir, int(episodes), cameras.split(","))
    elif kind == "robomimic":
        shim, data_file, low_dim, cameras, out = args
        arrays = robomimic(shim, data_file, low_dim.split(","), cameras.split(","))
    else:
        raise SystemExit(f"unknown reader {kind!r}")
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
