"""Splitting work and parameters among workers: contiguous shards, and a network's parameters as one flat vector.

Threads (lab 02), MPI ranks (labs 06-11) and parameter-server masters all split the same way: ``n`` items into
``parts`` contiguous pieces of floor(n/parts), the first n % parts one longer. Collectives, data parallelism and
the parameter servers move a network's parameters as one contiguous vector (:func:`flatten`) and read it back as
params-shaped views (:func:`unflatten`).
"""

from __future__ import annotations

import numpy as np


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split range(n) into ``parts`` contiguous (start, stop) pieces: floor(n/parts) each, the first n % parts one longer."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_of(n: int, parts: int, k: int) -> tuple[int, int]:
    """Shard ``k`` of :func:`shard_bounds` (n, parts), computed alone: the rows one rank of ``parts`` takes, without
    building every rank's list (labkit's answer to lab 08's first exercise)."""
    if not 0 <= k < parts:
        raise ValueError(f"k must be between 0 and parts - 1 = {parts - 1}, got {k}")
    base, extra = divmod(n, parts)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


def ring_chunks(rank: int, step: int, parts: int) -> tuple[int, int]:
    """(the chunk sent, the chunk received) by ``rank`` at step ``step`` (0 .. parts - 2) of a ring reduce-scatter on
    ``parts`` ranks, in which every rank sends its own chunk first, to its right-hand neighbour (labkit's answer to
    lab 07's first exercise). After the last step the rank holds chunk (rank + 1) mod parts finished."""
    return (rank - step) % parts, (rank - step - 1) % parts


def flatten(grads: list, extra: tuple[float, ...] = ()) -> np.ndarray:
    """All arrays of a params-like list of (W, b) pairs (then ``extra`` scalars) as one new contiguous 1-D buffer."""
    parts = [a.reshape(-1) for pair in grads for a in pair]
    dtype = grads[0][0].dtype
    if extra:
        parts.append(np.asarray(extra, dtype=dtype))
    return np.concatenate(parts)


def unflatten(vec: np.ndarray, like: list) -> list:
    """Views into ``vec`` shaped like ``like`` (the inverse of :func:`flatten` without its extras): writing into
    them writes into ``vec``."""
    out, pos = [], 0
    for W, b in like:
        gW = vec[pos:pos + W.size].reshape(W.shape)
        pos += W.size
        gb = vec[pos:pos + b.size]
        pos += b.size
        out.append((gW, gb))
    return out
