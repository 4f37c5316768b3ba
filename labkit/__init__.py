"""labkit: course labs for parallel and distributed neural-network training.

Modules, in teaching order: ``data``, ``mlp``, ``cpu_parallel``, ``device``, ``cluster``,
``collectives``, ``costmodel``, ``bench``, ``plots``, ``check``, ``report``. They are imported on first
use, so ``import labkit`` needs no GPU, no MPI and no running cluster.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("bench", "check", "cluster", "collectives", "costmodel", "cpu_parallel", "data", "device", "doctor", "kernels",
               "mlp", "plots", "progress", "report")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
