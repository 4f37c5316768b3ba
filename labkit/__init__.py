"""labkit: course labs for parallel and distributed neural-network training.

The labs, each with its notebook, lesson modules, checks and claims, are declared once in ``labs``; the lessons'
modules, in teaching order: ``data``, ``mlp``, ``shards``, ``cpu_parallel``, ``hostc``, ``openmp``, ``device``,
``kernels``, ``collectives``, ``traffic``, ``costmodel``, ``comm_backends``, ``data_parallel``, ``param_server``,
``compression``, ``model_parallel``, ``scaling``. Around them: ``check`` (the exercises and their checks), ``cluster``
(where MPI runs), ``network`` (the labs' network that costs: shaped cables between hosts), ``native`` (the C and C++
toolchain that ``hostc`` and ``kernels`` share: reading C source, compiling it into a cache), ``grading`` (the
grader), ``handout`` (a lab notebook's student version, the only one the wheel ships); ``bench``, ``benchmarks``,
``plots``, ``runner`` (a notebook run headlessly) and ``report`` (measuring and drawing); ``questions`` (a prediction
beside its measurement) and ``claims`` (the text checked against the run); ``settings``, ``machine``, ``progress``,
``errors``, ``doctor``, ``gpucheck``, ``wheelhouse`` and ``cli``. They are imported on first use, so ``import labkit``
needs no GPU, no MPI and no running cluster.
"""

from __future__ import annotations

import importlib
import pkgutil

__version__ = "0.1.0"

# every public module and package of labkit, found (not listed): a module added is an attribute as it lands
_SUBMODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES))
