"""Tests found by lab: every test carries the marker of each lab whose pieces it exercises (``pytest -m lab07``).

A test's labs are read, in this order, from
- the lab notebook its parameters name (``test_notebooks.py::...[07_ring_allreduce.ipynb]``);
- the exercise its parameters name (a check's contract, run for each exercise of the registry);
- otherwise its module: the MPI programs of named cases it runs (tests/mpi/cases_*.py), the check modules of
  labkit it imports, the exercises it calls as ``check.<name>``, and of the lesson modules it imports the one taught
  last (a test of lab 08's data_parallel imports lab 01's mlp too), each declared by its lab in labkit/labs.py.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from labkit import labs

MPI_CASES = Path(__file__).resolve().parent / "mpi"
CHECKS = Path(labs.__file__).resolve().parent / "check"
_CASES = re.compile(r"cases_\w+\.py")
_NOTEBOOK = re.compile(r"\b(\d\d)_[a-z_]+(\.ipynb)?\b")


@functools.cache
def _exercises() -> dict[str, str]:
    """Exercise name -> its lab, read from the check modules' ``Exercise("name", "NN", ...)`` declarations as text:
    importing every check family would slow down every pytest run's collection."""
    found = {}
    for path in sorted(CHECKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Exercise" and len(node.args) >= 2
                    and all(isinstance(a, ast.Constant) for a in node.args[:2])):
                found[node.args[0].value] = node.args[1].value
    return found


@functools.cache
def _by_module() -> dict[str, set[str]]:
    """labkit module (``mlp``, ``check.ring``) -> the labs that declare it."""
    found: dict[str, set[str]] = {}
    for lab in labs.LABS:
        for m in lab.lessons:
            found.setdefault(m, set()).add(lab.number)
        for c in lab.checks:
            found.setdefault(f"check.{c}", set()).add(lab.number)
    return found


@functools.cache
def labs_of_module(path: str) -> frozenset[str]:
    """The labs a test module's imports and ``check.<exercise>`` calls name."""
    tree = ast.parse(Path(path).read_text())
    names: set[str] = set()
    cases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "labkit":
            base = node.module.split(".")[1:]
            names |= {".".join(base + [a.name]) for a in node.names} | ({".".join(base)} if base else set())
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("labkit.")}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "check":
            names.add(f"exercise:{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _CASES.fullmatch(node.value):
            cases.add(node.value)  # an MPI program of named cases the test runs: its labs are the test's
    found = {n for c in cases if (MPI_CASES / c).exists() for n in labs_of_module(str(MPI_CASES / c))}
    latest = -1  # of the lessons it imports, the one taught last says whose test it is (mlp serves every lab)
    order = labs.lessons()
    for name in names:
        if name.startswith("exercise:"):
            found |= {_exercises()[name[9:]]} if name[9:] in _exercises() else set()
            continue
        parts = name.split(".")  # kernels.counts is the kernels lesson's; check.ring.X is check.ring
        if parts[0] == "check" and len(parts) > 1 and f"check.{parts[1]}" in _by_module():
            found |= _by_module()[f"check.{parts[1]}"]
        elif parts[0] in order:
            latest = max(latest, order.index(parts[0]))
    return frozenset(found | (_by_module()[order[latest]] if latest >= 0 else set()))


def labs_of(item: pytest.Item) -> set[str]:
    """The labs (``"07"``) one collected test exercises."""
    spec = getattr(item, "callspec", None)
    params = list(spec.params.values()) if spec is not None else []
    known = {lab.number for lab in labs.LABS}
    named = {m.group(1) for p in params for m in [_NOTEBOOK.search(str(getattr(p, "name", p)))] if m} & known
    if named:
        return named
    exercised = {_exercises()[n] for p in params for n in [getattr(p, "name", p)] if isinstance(n, str) and n in _exercises()}
    if exercised:
        return exercised
    return set(labs_of_module(str(item.path))) if item.path.suffix == ".py" else set()


def register(config) -> None:
    for lab in labs.LABS:
        config.addinivalue_line("markers", f"{lab.marker}: exercises lab {lab.number} ({lab.title})")


def mark(items) -> None:
    for item in items:
        for number in sorted(labs_of(item)):
            item.add_marker(getattr(pytest.mark, labs.get(number).marker))
