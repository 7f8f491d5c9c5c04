"""Where each feature goes in the trainer layouts (``--hdf5-layout aloha|robomimic``): the default
names, ``--hdf5-map FEATURE=NAME`` over them, and the refusals (a name given twice, a feature
the dataset does not have), decided from info.json alone, before anything is written.

aloha: ``qpos`` <- ``observation.state`` or ``observation.qpos``; ``qvel`` <-
``observation.velocity`` or ``observation.qvel``; ``effort`` <- ``observation.effort``;
``action`` <- ``action``; a camera is named by its key's last part
(``observation.images.cam_high`` -> ``cam_high``); any other feature keeps its key under
``/observations/extra``. robomimic: ``actions`` <- ``action``; a camera by its key's last part;
any other feature by its key without the ``observation.`` prefix (``observation.state`` ->
``state``), all under ``obs/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eva.formats.base import OptionError

# aloha's places of a vector, the feature keys that go there by default (the first present).
ALOHA_DEFAULTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qpos", ("observation.state", "observation.qpos")),
    ("qvel", ("observation.velocity", "observation.qvel")),
    ("effort", ("observation.effort",)),
    ("action", ("action",)),
)
ALOHA_VECTORS = tuple(name for name, _ in ALOHA_DEFAULTS)
# aloha's vectors a file always has: ACT reads qvel (unused) and stacks qpos and action; the
# ALOHA recorder writes effort. A dataset without one of the last two gets zeros there.
ALOHA_ZERO_FILLED = ("qvel", "effort")
ROBOMIMIC_ACTIONS = "actions"


@dataclass(frozen=True)
class LayoutNames:
    """Each exported feature's name in a trainer layout, in info.json's order."""

    vectors: dict[str, str]  # feature key -> name (aloha: a place or an extra; robomimic: obs key)
    cameras: dict[str, str]  # camera key -> camera name

    def name_of(self, feature: str) -> str:
        return self.vectors.get(feature) or self.cameras[feature]


def camera_name(key: str) -> str:
    """A camera's default name: its key's last dotted part."""
    return key.rsplit(".", 1)[-1]


def _default_name(layout: str, feature: str, is_camera: bool) -> str:
    if is_camera:
        return camera_name(feature)
    if layout == "robomimic":
        if feature == "action":
            return ROBOMIMIC_ACTIONS
        return feature.removeprefix("observation.").replace(".", "_")
    return feature


def layout_names(
    layout: str,
    features: Mapping[str, Mapping[str, Any]],
    video_keys: Sequence[str],
    feature_map: Sequence[tuple[str, str]],
) -> LayoutNames:
    """Every feature's name in ``layout`` (aloha or robomimic); an ``OptionError`` naming the
    feature for a map entry naming no feature, two features given one name, or a layout
    missing what its trainer needs (aloha: qpos and action; robomimic: actions)."""
    given = dict(feature_map)
    for feature in given:
        if feature not in features:
            raise OptionError(
                "hdf5_map", f"{feature}: not a feature of the dataset ({', '.join(features)})"
            )
    cameras = set(video_keys)
    names: dict[str, str] = {feature: given[feature] for feature in features if feature in given}
    if layout == "aloha":
        taken = set(names.values())
        for place, candidates in ALOHA_DEFAULTS:
            found = next((c for c in candidates if c in features and c not in names), None)
            if place not in taken and found is not None:
                names[found] = place
    for feature in features:
        names.setdefault(feature, _default_name(layout, feature, feature in cameras))
    _check_unique(layout, names, given)
    _check_required(layout, names)
    ordered = {feature: names[feature] for feature in features}
    return LayoutNames(
        {f: n for f, n in ordered.items() if f not in cameras},
        {f: n for f, n in ordered.items() if f in cameras},
    )


def _check_unique(layout: str, names: Mapping[str, str], given: Mapping[str, str]) -> None:
    """One feature per name (aloha: an extra, an image or a place each; robomimic: an obs key)."""
    owner: dict[str, str] = {}
    for feature, name in sorted(names.items(), key=lambda item: item[0] not in given):
        if name in owner:
            how = "mapped" if feature in given else "named by default"
            raise OptionError(
                "hdf5_map",
                f"{feature}: {how} {name!r}, which is already {owner[name]}'s name in {layout} "
                f"(--hdf5-map {feature}=OTHER)",
            )
        owner[name] = feature


def _check_required(layout: str, names: Mapping[str, str]) -> None:
    present = set(names.values())
    needed = ("qpos", "action") if layout == "aloha" else (ROBOMIMIC_ACTIONS,)
    for name in needed:
        if name not in present:
            raise OptionError(
                "hdf5_map",
                f"{name}: no feature of the dataset is {layout}'s {name} "
                f"(--hdf5-map FEATURE={name})",
            )
