"""The architecture the tree shows: lessons below the machinery, one error family, one registry of exercises, and
``labkit.<module>`` for every public module."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import labkit
from labkit import check, labs, runner
from labkit.check.exercises import EXERCISES, exercise
from labkit.errors import LabkitError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "labkit"
# what students import and read: the lessons, flat under labkit/
LESSONS = labs.lessons() + tuple(labs.COMING)  # every lab's lesson modules, and a coming lab's (labkit/labs.py)
# (importer, what it may never import): the grader sits above the checks, the checks above the lessons
NEVER = [(f"labkit.{lesson}", forbidden) for lesson in LESSONS for forbidden in ("labkit.grading", "labkit.check")]
NEVER += [("labkit.check", "labkit.grading"), ("labkit.cluster", "labkit.grading"), ("labkit.cluster", "labkit.check")]
# the C and C++ toolchain that labs 03-05 share (labkit.native) stands below them all: it imports no lesson, and lab
# 03's C takes what it shares with the CUDA labs from it, never from their package
NEVER += [("labkit.native", f"labkit.{lesson}") for lesson in LESSONS]
NEVER += [("labkit.hostc", "labkit.kernels"), ("labkit.openmp", "labkit.kernels")]


def _module_files():
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imported(name: str, path: Path) -> set[str]:
    """Every labkit module the file imports, at any depth (lazy imports inside functions too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found |= {target} | {f"{target}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.startswith("labkit")}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_lessons_never_import_the_grader_nor_the_checks():
    broken = []
    for name, path in _module_files():
        for importer, forbidden in NEVER:
            if _within(name, importer):
                broken += [f"{name} imports {m}" for m in _imported(name, path) if _within(m, forbidden)]
    assert not broken, broken


def test_the_layering_test_sees_a_lesson_that_imports_the_grader(tmp_path):
    """The rule's reader finds a lazy import inside a function, relative or absolute."""
    fake = tmp_path / "mlp.py"
    fake.write_text("def f():\n    from .grading import grade\n    import labkit.check.capture\n")
    assert {"labkit.grading", "labkit.check.capture"} <= _imported("labkit.mlp", fake)


def test_every_public_module_is_an_attribute_of_labkit():
    public = sorted(m.name for m in pkgutil.iter_modules(labkit.__path__) if not m.name.startswith("_"))
    assert sorted(labkit._SUBMODULES) == public
    for name in public:
        assert getattr(labkit, name).__name__ == f"labkit.{name}"
    assert set(public) <= set(dir(labkit))
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        labkit.nonesuch  # noqa: B018


def test_every_labkit_exception_is_a_labkit_error():
    found, outside = [], []
    for info in pkgutil.walk_packages(labkit.__path__, "labkit."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and not issubclass(obj, Warning)
                    and obj.__module__ == module.__name__):
                found.append(obj)
                if not issubclass(obj, LabkitError):
                    outside.append(f"{info.name}.{name}")
    assert len(found) >= 20 and not outside, outside


def test_the_c_and_cuda_twins_share_their_bases():
    from labkit import errors, hostc
    from labkit.kernels import emulator, source

    for c_error, cuda_error, base in ((hostc.CompilerMissing, emulator.EmulatorUnavailable, errors.ToolMissing),
                                      (hostc.CCompileError, source.KernelCompileError, errors.CompileError),
                                      (hostc.CError, emulator.KernelError, errors.CodeError)):
        assert issubclass(c_error, base) and issubclass(cuda_error, base)
        assert issubclass(base, RuntimeError), "older `except RuntimeError` clauses still catch them"


def test_every_exercise_is_declared_once_and_called_in_its_lab():
    import nbformat

    from labkit.grading.assign import exercises_in

    assert set(check.__all__) - {"ExerciseError", "KERNEL_TODO"} == set(EXERCISES)
    called = {p.name[:2]: {name for _, name in exercises_in(nbformat.read(p, as_version=4))}
              for p in runner.find_notebooks()}
    for name, ex in EXERCISES.items():
        assert ex.check() is getattr(check, name), f"{name}: check.{name} is not the declared check"
        assert name in called[ex.lab], f"{name}: lab {ex.lab} does not call check.{name}"
        for spec in ex.references:
            module, qualname = spec.split(":")
            assert hasattr(importlib.import_module(module), qualname), f"{name}: no reference {spec}"
        for rel, _ in ex.sources:
            assert (PACKAGE / rel).is_file(), f"{name}: no file labkit/{rel}"
    assert exercise("ring_allreduce#2") is EXERCISES["ring_allreduce"] and exercise("nonesuch") is None


def test_assign_refuses_a_check_cell_that_names_no_exercise(tmp_path):
    import nbformat

    from labkit.grading import assign

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("check.backprpo(f)")])
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(ValueError, match=r"check.backprpo \(cell 1\) is no exercise labkit knows"):
        assign.write_student_versions([path], tmp_path / "out")
    with pytest.raises(ValueError, match="labkit/check/exercises.py"):
        assign.nbgrader_source(nb)
    assert not (tmp_path / "out").exists(), "nothing is written"
