"""A warp in NumPy: what CUDA's warp intrinsics give each of the 32 lanes, the executable spec the emulator is tested
against (and a GPU, where one is lent).

    shfl(values, "down", 16)          # lane i gets values[i + 16], or its own value where i + 16 leaves its segment
    ballot(predicates, mask)          # the bits of the lanes in mask whose predicate is true

``values`` and ``predicates`` hold one entry per lane (32); an argument may be one number for every lane or one per
lane. ``width`` splits the warp into segments of that many lanes (a power of 2), each shuffling within itself.
"""

from __future__ import annotations

import numpy as np

WARP = 32
KINDS = ("idx", "up", "down", "xor")  # __shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync


def sources(kind: str, arg, width: int = WARP) -> np.ndarray:
    """The lane each lane reads in a shuffle of ``kind`` with lane argument ``arg`` (srcLane, delta or laneMask);
    a lane that reads itself keeps its own value."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if width not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"width must be a power of 2 from 1 to 32, not {width}")
    lane = np.arange(WARP)
    a = np.broadcast_to(np.asarray(arg, dtype=np.int64), (WARP,)).astype(np.uint32).astype(np.int64)
    seg = lane & ~(width - 1)  # the first lane of each lane's segment
    if kind == "idx":
        return seg + (a & (width - 1))
    if kind == "up":
        return np.where(lane - seg >= a, lane - a, lane)
    if kind == "down":
        return np.where(lane - seg + a < width, lane + a, lane)
    x = lane ^ a
    return np.where(x < seg + width, x, lane)  # a later segment is out of reach: the lane keeps its value


def shfl(values, kind: str, arg, width: int = WARP) -> np.ndarray:
    """What each lane gets from ``__shfl_<kind>_sync(0xffffffff, values[lane], arg, width)``."""
    values = np.asarray(values)
    if values.shape != (WARP,):
        raise ValueError(f"values must hold one entry per lane ({WARP}), got shape {values.shape}")
    return values[sources(kind, arg, width)]


def ballot(predicates, mask: int = 0xFFFFFFFF) -> int:
    """``__ballot_sync(mask, predicate)``: bit i set where lane i is in ``mask`` and its predicate is true."""
    p = np.asarray(predicates).astype(bool)
    return int(sum(1 << i for i in range(WARP) if p[i] and mask >> i & 1))


def any_(predicates, mask: int = 0xFFFFFFFF) -> bool:
    """``__any_sync``: is the predicate true on some lane of ``mask``?"""
    return ballot(predicates, mask) != 0


def all_(predicates, mask: int = 0xFFFFFFFF) -> bool:
    """``__all_sync``: is the predicate true on every lane of ``mask``?"""
    return ballot(predicates, mask) == mask


def tree_sum(values, offsets=(16, 8, 4, 2, 1), kind: str = "down") -> np.ndarray:
    """The warp-shuffle reduction: one ``v += __shfl_<kind>_sync(0xffffffff, v, offset)`` per offset (16, 8, 4, 2, 1:
    lane 0 then holds the warp's total); returns every lane's value after the last step."""
    v = np.asarray(values).copy()
    for offset in offsets:
        v = v + shfl(v, kind, offset)
    return v
