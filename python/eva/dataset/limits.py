"""The numeric limits a dataset's writer and its validator share, stated once.

Every entry point that takes one of these numbers from a user (``eva collect``'s config, the
console) checks it against the same constant the writer and the validator use, so a value an
entry accepts is never refused later (docs/config.md, "Limits").
"""

from __future__ import annotations

# Frame rates a dataset may declare: LeRobot stores fps as a whole number of frames per second;
# the validator refuses more than this (``info.json`` ``fps``).
MAX_FPS = 1000

# Camera images: at most 8192 pixels a side and 8192 x 4352 pixels in all, the largest frame of
# H.264's highest level (6.2: 139,264 macroblocks of 16 x 16). One frame is then at most
# 107 MB of RGB, which a capture ring, an encoder batch and an HDF5 chunk must hold.
MAX_IMAGE_SIDE = 8192
MAX_IMAGE_PIXELS = 139_264 * 16 * 16

# Frames between keyframes (``collection.encoder.gop``): ten seconds at MAX_FPS. The encoders
# take a C int; a longer GOP only makes every seek decode more.
MAX_GOP = 10_000

# A vector stream's width (joint states, actions): a capture ring holds 60 s of it at 1 kHz.
MAX_VECTOR_DIM = 4096


def image_size_problem(width: int, height: int) -> str | None:
    """Why a ``width`` x ``height`` camera image cannot be recorded (None when it can)."""
    if not (2 <= width <= MAX_IMAGE_SIDE and 2 <= height <= MAX_IMAGE_SIDE):
        return f"{width}x{height}: each side must be 2..{MAX_IMAGE_SIDE} pixels"
    if width * height > MAX_IMAGE_PIXELS:
        return (
            f"{width}x{height}: {width * height} pixels, more than {MAX_IMAGE_PIXELS} "
            "(H.264's largest frame, 8192x4352)"
        )
    if width % 2 or height % 2:
        return f"{width}x{height}: yuv420p video needs even sizes"
    return None
