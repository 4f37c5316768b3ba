"""Every graded exercise, declared once, by the check module of its family: its name, lab, check, hints, labkit's own
solution and how the grader launches it. Its module is not declared but derived: the family it is declared in.

A notebook calls the check as ``check.<name>(...)`` in a cell of its own. The capture (:mod:`.capture`) fails an
exercise whose function uses one of its ``references``; the grader replays an ``mpi`` exercise's check on every rank
under ``mpiexec``; ``labkit assign`` and the nbgrader export accept check cells only for exercises declared here.

Adding an exercise: write its check in the module of its family (or a new module of ``labkit/check/``), declare it
in that module's ``EXERCISES`` tuple, and call it in its lab's notebook. ``labkit.check.<name>`` finds it there.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import KW_ONLY, dataclass, replace
from pathlib import Path

NOT_FAMILIES = ("capture", "common", "exercises")  # the modules of labkit/check/ that declare no exercises


@dataclass(frozen=True)
class Exercise:
    name: str                            # check.<name> in the notebook, and the row in the grades
    lab: str                             # the notebook's number: "01" ... "12"
    _: KW_ONLY
    references: tuple[str, ...] = ()     # labkit's solution, "module:qualname" (a class: all its methods)
    sources: tuple[tuple[str, str | None], ...] = ()  # C or CUDA C: (file under labkit/, function or None: the file)
    mpi: bool = False                    # the check runs on every rank of an MPI job
    hints: tuple[str, ...] = ()          # the derivation, a step at a time: one more after each failed run
    module: str = ""                     # derived where the registry is built: the family under labkit.check declaring it

    def check(self):
        """The check function itself."""
        return getattr(importlib.import_module(f"labkit.check.{self.module}"), self.name)


_loaded: dict[str, Exercise] | None = None


def _load() -> dict[str, Exercise]:
    global _loaded
    if _loaded is None:
        found: dict[str, Exercise] = {}
        for family in families():
            module = importlib.import_module(f"labkit.check.{family}")
            for e in getattr(module, "EXERCISES", ()):
                if e.name in found:
                    raise RuntimeError(f"exercise {e.name!r} is declared twice ({found[e.name].module} and {family})")
                if e.module:
                    raise RuntimeError(f"exercise {e.name!r} names its module: it is the one declaring it, {family}")
                found[e.name] = replace(e, module=family)
        _loaded = dict(sorted(found.items(), key=lambda kv: (kv[1].lab, kv[0])))
    return _loaded


def families() -> list[str]:
    """The check modules of labkit/check/, each declaring its exercises in ``EXERCISES``."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                  if m.name not in NOT_FAMILIES)


def __getattr__(name: str):
    if name == "EXERCISES":  # built on first use: the check modules import this one
        return _load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def exercise(name: str) -> Exercise | None:
    """The exercise of a check cell's name (``ring_allreduce``, or ``ring_allreduce#2`` for its second call)."""
    return _load().get(name.split("#", 1)[0])


def in_lab(lab: str) -> list[Exercise]:
    """The exercises of one lab ("07"), in name order."""
    return [e for e in _load().values() if e.lab == lab]
