"""labkit: course labs for parallel and distributed neural-network training.

Modules, in teaching order: ``data``, ``mlp``, ``shards``, ``cpu_parallel``, ``hostc``, ``openmp``, ``device``,
``kernels``, ``cluster``, ``collectives``, ``traffic``, ``costmodel``, ``comm_backends``, ``bench``, ``scaling``,
``plots``, ``check``, ``report``; around them ``settings``, ``machine``, ``doctor``, ``gpucheck``. They are
imported on first use, so ``import labkit`` needs no GPU, no MPI and no running cluster.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("bench", "check", "cluster", "collectives", "comm_backends", "costmodel", "cpu_parallel", "data", "device",
               "doctor", "gpucheck", "hostc", "kernels", "machine", "mlp", "openmp", "plots", "progress", "report",
               "scaling", "settings", "shards", "traffic")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
