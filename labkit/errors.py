"""The errors labkit raises of its own. Each subclasses :class:`LabkitError` (catch it to catch them all) and the
built-in exception it always was (``ValueError``, ``RuntimeError``...), so older ``except`` clauses still match.

The C lab (:mod:`labkit.hostc`) and the CUDA labs (:mod:`labkit.kernels`) fail in the same three ways, each with
a class of its own in its module and a base here that says what they share: :class:`ToolMissing` (no compiler),
:class:`CompileError` (the compiler refused the code) and :class:`CodeError` (the compiled code failed as it ran).
"""

from __future__ import annotations


class LabkitError(Exception):
    """An error of labkit's; its message says what went wrong and what to do."""


class ToolMissing(LabkitError, RuntimeError):
    """A program labkit needs is not on this machine (a compiler, SLURM, namespaces); the message names what to install."""


class CompileError(LabkitError, RuntimeError):
    """The compiler refused the code; the message holds its words, at the student's line."""


class CodeError(LabkitError, RuntimeError):
    """Compiled code failed as it ran (a bad index, a race, a crash); the message names the function and line."""
