"""The test tiers: a test carries a marker for each costly thing it starts, so ``make test-fast`` can leave them out.

Tests mark themselves by what they use: a name in USES (a helper of conftest or a labkit entry point that starts
MPI, clusters or hosts) anywhere in the test, its fixtures or the module's functions they call adds that name's
markers at collection. A guard then holds every test to its markers: a test (or its fixture's setup) that starts a
program of one of the kinds in STARTS without carrying that kind's marker fails, naming the program and the marker to
add. The guard sees what the test's own process starts, and of what that starts in turn only what a labkit command
line says it will (``python -m labkit lab`` starts JupyterLab).
"""

from __future__ import annotations

import re
import types
from pathlib import PurePath

import pytest

# What the fast tier leaves out: every test carrying one of these
COSTLY = ("slow", "notebooks", "mpi", "compile", "cluster", "hosts", "sandbox", "browser", "gpu")

# names whose use in a test brings markers (from tests/conftest.py and labkit)
USES = {
    "run_mpi_cases": ("mpi",),
    "run_mpi_case": ("mpi",),
    "run_failing_mpi": ("mpi",),
    "run_mpi": ("mpi",),
    "MPICluster": ("mpi", "cluster"),
    "namespace_hosts": ("hosts", "mpi"),
    "costly_network": ("hosts", "mpi"),
    "NamespaceHosts": ("hosts",),
    "slurm_cluster": ("hosts", "mpi"),
    "lab_server": ("cluster",),
}

# what a started program's command line says about its kind: (marker, pattern on the program's name, or on the line)
_PROGRAMS = {
    "mpi": r"mpiexec|mpirun|hydra_pmi_proxy",
    "compile": r"([\w.-]+-)?(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|nvcc|ptxas)(-\d+)?",
    "hosts": r"ip|unshare|nsenter|slurmctld|slurmd|munged|sbatch|srun|salloc",
    "sandbox": r"bwrap",
    "browser": r"chromium|chromium-browser|chrome|google-chrome",
}
_LINES = {  # labkit's own commands that start these in turn count too
    "cluster": r"ipyparallel|ipcontroller|ipengine|jupyter[-_ ]?lab|jupyter[-_]server|-m labkit(\.cli)? lab\b(?!.*--help)",
    "notebooks": r"ipykernel_launcher|ipykernel\b|-m labkit(\.cli)? (report|grade)\b(?!.*--help)",
    "browser": r"playwright",
    "sandbox": r"labkit\.grading\.sandbox\b|(^|/)bwrap\b",
}
STARTS = [(m, re.compile(rf"^(?:{p})$")) for m, p in _PROGRAMS.items()]
STARTS_LINE = [(m, re.compile(p)) for m, p in _LINES.items()]


def kinds_of(args) -> set[str]:
    """The markers a command (a Popen ``args``) needs."""
    if isinstance(args, (str, bytes, PurePath)):
        line = args.decode() if isinstance(args, bytes) else str(args)
        argv = line.split()
    else:
        argv = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        line = " ".join(argv)
    if not argv:
        return set()
    name = PurePath(argv[0]).name
    found = {m for m, pattern in STARTS if pattern.match(name)}
    return found | {m for m, pattern in STARTS_LINE if pattern.search(line)}


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def used_names(item: pytest.Item) -> set[str]:
    """Every name the test's code uses, through its fixtures and the functions of its module that it calls."""
    module = getattr(item, "module", None)
    functions = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        functions += [d.func for d in defs]
    names: set[str] = set()
    seen: set[types.CodeType] = set()
    while functions:
        fn = functions.pop()
        code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        found = _code_names(code)
        names |= found
        for name in found:  # the module's own helpers, called from the test or from another helper
            helper = getattr(module, name, None)
            if isinstance(helper, types.FunctionType) and helper.__module__ == module.__name__:
                functions.append(helper)
    return names
