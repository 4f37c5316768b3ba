"""Checks for the notebooks' exercises: run a student's function against the reference and say what is wrong.

Each check prints one line when everything passes and otherwise raises :class:`ExerciseError`
with what was tested, what was expected against what came back, and a hint: after each failed run one more step of
the exercise's derivation (:class:`.exercises.Exercise` ``hints``), never the solution.

One module per family, each named for what it checks and declaring its exercises (:func:`.exercises.families`);
the notebooks call them as ``check.<name>``, found here through the one registry.
"""

from __future__ import annotations

from .common import ExerciseError
from .kernels import KERNEL_TODO


def __getattr__(name: str):
    from .exercises import exercise

    declared = exercise(name) if not name.startswith("_") else None
    if declared is None:
        raise AttributeError(f"labkit.check has no exercise {name!r}: the exercises are "
                             f"{', '.join(sorted(_names()))}")
    return declared.check()


def _names() -> list[str]:
    from .exercises import EXERCISES

    return list(EXERCISES)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_names()))


__all__ = ["ExerciseError", "KERNEL_TODO", *_names()]
