"""What this process may use of the machine: the cores it can run on, and what timings were measured on.

``os.cpu_count()`` counts the machine's cores, not the ones a process may use. A container capped by a cgroup
CPU quota, or a job pinned to some cores (``taskset``, SLURM, ``mpiexec -bind-to``), has fewer, and sizing
thread pools, heavy yield or a benchmark's core count by the machine's total then oversubscribes it.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import numpy as np


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``),
    None when unlimited or unknown."""
    try:
        v2, v1 = "", ""
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0":  # the v2 hierarchy
                v2 = parts[2].lstrip("/")
            elif "cpu" in parts[1].split(","):
                v1 = parts[2].lstrip("/")
        for folder in (root / v2, root):
            f = folder / "cpu.max"
            if f.exists():
                quota, period = f.read_text().split()[:2]
                return None if quota == "max" else int(quota) / int(period)
        for folder in (root / "cpu" / v1, root / "cpu"):
            q, p = folder / "cpu.cfs_quota_us", folder / "cpu.cfs_period_us"
            if q.exists() and p.exists():
                quota, period = int(q.read_text()), int(p.read_text())
                return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        pass
    return None


def usable_cores() -> int:
    """Cores this process may use: its affinity mask, capped by its cgroup's CPU quota (rounded up), at least 1."""
    n = _affinity()
    quota = cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def machine_info() -> dict:
    """What the numbers were measured on: usable and total cores, Python, NumPy, BLAS library and its threads."""
    info = {"cpus": usable_cores(), "cpus_machine": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "machine": platform.machine()}
    try:
        from threadpoolctl import threadpool_info

        blas = [d for d in threadpool_info() if d.get("user_api") == "blas"]
        if blas:
            info["blas"] = f"{blas[0].get('internal_api')} {blas[0].get('version')}"
            info["blas_threads"] = blas[0].get("num_threads")
    except ImportError:
        pass
    return info



def cores_free(threads: int, seconds: float = 0.2) -> float:
    """How many cores ``threads`` threads of this process got just now: each hashes a buffer (work that runs outside
    Python's lock) for ``seconds``, and their CPU-seconds together over the wall-clock seconds is the answer, between
    0 and ``threads``. On a quiet machine it is min(threads, the usable cores); beside other work it is less, and so
    is the most a parallel run of ``threads`` threads could gain then. Measure it beside the run it speaks for."""
    import hashlib
    import threading
    import time

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    block = bytes(1 << 20)
    used = [0.0] * threads
    start = threading.Barrier(threads + 1)

    def spin(i: int) -> None:
        start.wait()
        t0, c0 = time.perf_counter(), time.thread_time()
        h = hashlib.sha256()
        while time.perf_counter() - t0 < seconds:
            h.update(block)  # hashlib lets go of the GIL for large buffers
        used[i] = time.thread_time() - c0

    workers = [threading.Thread(target=spin, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    t0 = time.perf_counter()
    start.wait()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    return min(float(threads), sum(used) / wall) if wall > 0 else float(threads)


def cores_reading(threads: int, free: float, speedup: float, unit: str = "threads") -> str:
    """A speedup of ``threads`` threads (or ranks, ``unit``) set beside the cores they had (:func:`cores_free`, which
    for ranks reads how busy the machine's cores are): the limit it could reach this run, min(threads, free), and
    how much of it the speedup used."""
    limit = min(float(threads), free)
    return (f"{free:.1f} of {usable_cores()} cores were free for {threads} {unit} this run, so the limit was "
            f"{limit:.1f}x; the speedup {speedup:.2f}x is {speedup / limit:.0%} of it")
