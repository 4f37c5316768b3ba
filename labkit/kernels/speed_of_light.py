"""A GPU's view of a launch without a GPU: each unit's time on a named GPU, from the emulator's exact counts.

    t = counts.traffic(COPY, "copy_strided", grid, block, args)
    sol = speed_of_light.model(speed_of_light.counted(t, flops=0, footprint=2 * a.nbytes), "H100 SXM")
    sol.times        # {"DRAM": s, "L2": s, "shared memory": s, "FP32": s, "atomics (one address)": s}
    sol.bound, sol.unit

Like the speed-of-light section of Nsight Compute, every unit of the GPU gets the time it would need for the launch's
counted work at its published peak; the slowest unit sets the bound. It is a **lower bound**: no latency, no occupancy
limit (every SM that has a block runs at its peak), no overlap lost, and caches only as far as the counts say:

- every 32-byte sector a warp's request touches goes through the L2 (no L1 hits are assumed);
- DRAM moves the launch's footprint (its arrays' bytes) once, the least any cache allows, never more than the
  sectors; without a footprint, every sector;
- shared memory serves one wavefront (32 banks of 4 bytes) per clock on each SM that holds a block;
- FP32 units make the counted or declared floating-point operations (an FMA is 2) at the datasheet's FP32 rate,
  on the SMs that hold a block;
- atomics on one address are serialised, one per clock (an assumption: no datasheet publishes it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace

import numpy as np

from . import loader
from .counts import matmul_launch, traffic
from .gpus import DEFAULT, GPU, GPUS, named
from .matmul import BM, TILE
from .source import define

SECTOR = 32  # bytes a global-memory sector holds
UNITS = ("DRAM", "L2", "shared memory", "FP32", "atomics (one address)")


gpu_named = named  # the table's GPU a device name names (:func:`labkit.kernels.gpus.named`)


def gpu(name: str | GPU | None = None) -> GPU:
    """The GPU to model: ``name`` from the table (or a device name naming one), else the one in use, else the default."""
    if isinstance(name, GPU):
        return name
    if name is not None:
        found = GPUS.get(name) or gpu_named(name)
        if found is None:
            raise KeyError(f"no GPU {name!r} in the speed-of-light table; it has {list(GPUS)}")
        return found
    return in_use()[0]


def in_use() -> tuple[GPU, str]:
    """(the GPU to model, why): the CUDA device's entry where CuPy has one the table names, else the default."""
    if loader.backend() == "cupy":
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        found = gpu_named(device)
        if found is not None:
            return found, f"the GPU in use ({device})"
        return GPUS[DEFAULT], f"{DEFAULT}, the default: the GPU in use ({device}) is not in the table"
    return GPUS[DEFAULT], f"{DEFAULT}, the default: no GPU here"


@dataclass(frozen=True)
class Counts:
    """What one launch does, as the speed-of-light model takes it: counted on the emulator, or declared."""

    kernel: str
    load_requests: int
    load_sectors: int
    store_requests: int
    store_sectors: int
    shared_requests: int
    shared_wavefronts: int
    flops: float
    atomics: int = 0
    atomics_max_per_address: int = 0
    barriers: int = 0
    blocks: int = 1
    footprint: int | None = None  # bytes of the launch's arrays, DRAM's least traffic; None: every sector
    declared: tuple = field(default=())  # the fields the caller declared rather than counted

    @property
    def sector_bytes(self) -> int:
        """Bytes of every global sector the launch's requests touch, loads and stores."""
        return SECTOR * (self.load_sectors + self.store_sectors)

    @property
    def intensity(self) -> float:
        """Counted arithmetic intensity: flops over the bytes of the sectors the requests touch."""
        return self.flops / self.sector_bytes if self.sector_bytes else float("inf")

    def scaled(self, factors: dict) -> Counts:
        """These counts with each named field multiplied (for a launch too large to count, see :func:`extrapolate`)."""
        return replace(self, **{k: type(getattr(self, k))(getattr(self, k) * f) for k, f in factors.items()})


_COUNTED = ("load_requests", "load_sectors", "store_requests", "store_sectors", "shared_requests", "shared_wavefronts")
CARRIED = (*_COUNTED, "flops", "atomics", "atomics_max_per_address", "barriers", "blocks", "footprint")  # plain numbers


def counted(t, *, flops: float | None = None, atomics: int | None = None, atomics_max_per_address: int | None = None,
            footprint: int | None = None) -> Counts:
    """:class:`Counts` from a :class:`labkit.kernels.counts.Traffic`: its counts, and the rest from the traffic where
    the emulator counts it (``flops``, ``atomics``, ``atomics_max_per_address``, ``barriers``), else as declared."""
    declared = []
    values = {}
    for name, given in (("flops", flops), ("atomics", atomics), ("atomics_max_per_address", atomics_max_per_address)):
        have = getattr(t, name, None)
        if have is not None and given is None:
            values[name] = have
        elif given is not None:
            values[name] = given
            declared.append(name)
        elif name == "flops":
            raise ValueError(f"{t.kernel}: the emulator does not count floating-point operations here: declare them "
                             "(flops=2 * n**3 for an n x n x n product)")
        else:
            values[name] = 0
    if values["atomics"] and not values["atomics_max_per_address"]:
        raise ValueError(f"{t.kernel}: {values['atomics']} atomics declared: say how many hit the busiest address too "
                         "(atomics_max_per_address=...)")
    return Counts(t.kernel, *(t.total(f) for f in _COUNTED), flops=float(values["flops"]), atomics=int(values["atomics"]),
                  atomics_max_per_address=int(values["atomics_max_per_address"]), barriers=int(getattr(t, "barriers", 0)),
                  blocks=int(np.prod(t.grid)), footprint=footprint, declared=tuple(declared))


@dataclass(frozen=True)
class SpeedOfLight:
    """Each unit's time for one launch on one GPU, the bound (the slowest unit's time) and the unit that sets it."""

    counts: Counts
    gpu: GPU
    times: dict

    @property
    def bound(self) -> float:
        return max(self.times.values())

    @property
    def unit(self) -> str:
        return max(self.times, key=self.times.get)

    @property
    def gflops(self) -> float:
        """The modelled rate: the launch's flops over the bound."""
        return self.counts.flops / self.bound / 1e9 if self.bound else float("inf")

    def describe(self) -> str:
        parts = ", ".join(f"{u} {t * 1e6:.3g} µs" for u, t in self.times.items())
        return (f"{self.counts.kernel} on {self.gpu.name}: at least {self.bound * 1e6:.3g} µs, set by {self.unit} "
                f"({parts})")


def model(counts: Counts, on: str | GPU | None = None) -> SpeedOfLight:
    """The speed of light of the launch ``counts`` on the GPU ``on`` (see :func:`gpu`): each unit's least time."""
    g = gpu(on)
    if counts.flops < 0 or counts.load_sectors < 0 or counts.store_sectors < 0:
        raise ValueError(f"{counts.kernel}: counts cannot be negative")
    used = min(counts.blocks, g.sms) / g.sms  # a block runs on one SM: a grid of 4 blocks uses 4 SMs' units
    dram = counts.sector_bytes if counts.footprint is None else min(counts.footprint, counts.sector_bytes)
    times = {"DRAM": dram / g.dram_bytes_s,
             "L2": counts.sector_bytes / g.l2_bytes_s,
             "shared memory": counts.shared_wavefronts / (g.shared_wavefronts_s * used),
             "FP32": counts.flops / (g.fp32_flops_s * used),
             "atomics (one address)": counts.atomics_max_per_address / g.clock_hz}
    return SpeedOfLight(counts, g, times)


def extrapolate(small: Counts, large: Counts, n_small: int, n_large: int, n: int, *, flops: float,
                footprint: int, blocks: int) -> Counts:
    """The counts of a launch of size ``n`` from the same kernel counted at two sizes, for a kernel whose work grows
    as a n^3 + b n^2 (an n x n x n product on sizes that are multiples of its block's tile: n^3 in its loop over k,
    n^2 in what each thread writes once). Each field's a and b are solved from the two counts."""
    def fit(f: str) -> int:
        A = np.array([[n_small**3, n_small**2], [n_large**3, n_large**2]], dtype=float)
        a, b = np.linalg.solve(A, [getattr(small, f), getattr(large, f)])
        return int(round(a * n**3 + b * n**2))

    names = [f.name for f in fields(Counts) if f.name in _COUNTED or f.name in ("atomics", "atomics_max_per_address",
                                                                                 "barriers")]
    return replace(large, **{f: fit(f) for f in names}, flops=float(flops), footprint=footprint, blocks=blocks)


@functools.lru_cache(maxsize=32)  # a lab and the benchmark count the same small products again
def _matmul_counted(variant: str, n: int, source: str | None) -> tuple[Counts, int, str]:
    """(the counts of one n x n x n product by ``variant``, the block's tile, whose kernel), counted on the emulator."""
    if variant == "regblock":
        a, b = (np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) for _ in range(2))
        args = (a, b, np.zeros((n, n), np.float32), *(np.int32(n),) * 3, np.int32(0), np.int32(0))
        grid, block, tile, whose, src = (-(-n // BM),) * 2, (256,), BM, "labkit's", "matmul"
    else:
        src, _, grid, block, args, whose, tile = matmul_launch(source, variant, n)
    t = traffic(src, f"matmul_{variant}", grid, block, args)
    return counted(t, flops=2 * n**3, footprint=3 * 4 * n * n), tile, whose


def matmul_counts(variant: str, n: int, source: str | None = None) -> tuple[Counts, str]:
    """(the counts of an n x n x n float32 product by ``variant`` ("naive", "tiled", "regblock"), whose kernel): counted
    on the emulator at 2 and 4 times the block's tile (1 and 2 for the register-blocked kernel's 128), then carried to
    ``n`` by :func:`extrapolate` (a multiple of the tile, as large as a GPU's: counting 1024^3 would take minutes).
    ``source``: the student's kernel where written (the tiled one with its ``#define TILE``), else labkit's."""
    tile = BM if variant == "regblock" else (define(source, "TILE", TILE) if variant == "tiled" and source else TILE)
    k = 1 if variant == "regblock" else 2
    (small, _, whose), (large, _, _) = (_matmul_counted(variant, m * tile, source) for m in (k, 2 * k))
    if n % tile:
        raise ValueError(f"matmul_counts carries counts to multiples of the tile ({tile}); {n} is not one")
    return extrapolate(small, large, k * tile, 2 * k * tile, n, flops=2 * n**3, footprint=3 * 4 * n * n,
                       blocks=(n // tile) ** 2), whose
