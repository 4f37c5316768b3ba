"""A class graded end to end, as an instructor grades one: students handing in three labs, graded with a job per
core, then the feedback pages and both gradebook exports.

Run: ``labkit bench classroom [--quick] [--json]``

The class (40 students; 4 with ``--quick``) hands in labs 01 (serial), 07 (MPI engines) and 12 (speedup), made from
the instructor's notebooks: a quarter of the students solved every exercise, a quarter handed in the student version
untouched, a quarter wrote a wrong answer (the first exercise's solution replaced by ``return None``) and the rest
solved everything; two of them (one with ``--quick``) loop forever in lab 01's first exercise, which costs that cell
its whole limit (60 s, the grader's default). Keys: ``class_notebooks``, ``class_grading_seconds`` (``labkit grade
--jobs N``, N the usable cores), ``class_feedback_seconds``, ``class_exports_seconds`` and their sum
``class_seconds``, against the target of 15 minutes for 40 students on 2 cores; ``passed`` counts the exercises
passed by kind of student, which must be all for the solved, none for the blank and the endless exercise.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

from .. import runner
from ..bench import machine_info
from ..machine import usable_cores

LABS = ("01_", "07_", "12_")
TARGETS = {"class_seconds": ("<=", 900.0)}


def kind_of(i: int, n: int) -> str:
    """What student ``i`` of ``n`` hands in."""
    if i in ({1} if n < 20 else {1, 21}):
        return "endless"
    return ("solved", "blank", "wrong", "solved")[i % 4]


def _first_region(source: str, body: str) -> str:
    """``source`` with its first solution region replaced by ``body``, indented as the region was."""
    m = re.search(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[^\n]*", source, re.S | re.M)
    indent = m.group(1)
    return source[:m.start()] + "\n".join(indent + line for line in body.splitlines()) + source[m.end():]


def submission(lab: Path, kind: str):
    """The notebook a student of ``kind`` hands in for ``lab``."""
    import nbformat

    from ..grading import assign

    nb = nbformat.read(lab, as_version=4)
    if kind == "blank":
        return assign.student_notebook(nb)
    if kind in ("wrong", "endless"):
        first = next(c for c in nb.cells if c.cell_type == "code" and "### BEGIN SOLUTION" in c.source)
        first.source = _first_region(first.source, "return None" if kind == "wrong" else "while True:\n    pass")
    return _solutions_kept(nb)


def _solutions_kept(nb):
    """The instructor's notebook as a student who solved it hands it in: the solution markers gone."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = "\n".join(ln for ln in cell.source.splitlines()
                                    if "### BEGIN SOLUTION" not in ln and "### END SOLUTION" not in ln)
    return nb


def run(quick: bool = False, progress: bool | None = None) -> dict:
    import nbformat

    from ..grading import exports, feedback, grade, sandbox

    n = 4 if quick else 40
    jobs = usable_cores()
    labs = [runner.find_notebooks(only=k)[0] for k in LABS]
    with tempfile.TemporaryDirectory(prefix="labkit-bench-class-") as tmp:
        subs, out = Path(tmp) / "subs", Path(tmp) / "grades"
        kinds = {f"student{i:02d}": kind_of(i, n) for i in range(n)}
        for student, kind in kinds.items():
            (subs / student).mkdir(parents=True)
            for lab in labs:
                nb = submission(lab, kind if (kind != "endless" or lab.name.startswith("01_")) else "solved")
                nbformat.write(nb, subs / student / lab.name)
        t0 = time.perf_counter()
        results, _, json_path = grade.grade(subs, out, timeout=60, progress=progress, jobs=jobs)
        t1 = time.perf_counter()
        data = exports.load(json_path)
        pages = feedback.write(data, Path(tmp) / "feedback", out)
        t2 = time.perf_counter()
        exports.gradescope(data, out)
        exports.canvas(data, out)
        t3 = time.perf_counter()
    passed: dict = {}
    for r in results:
        got = passed.setdefault(kinds[r.student], [0, 0])
        got[0] += r.passed
        got[1] += 1
    result = {"quick": quick, "students": n, "labs": [p.name for p in labs], "jobs": jobs, "cores": usable_cores(),
              "isolated": sandbox.available()[0], "machine": machine_info(), "class_notebooks": n * len(labs),
              "class_grading_seconds": t1 - t0, "class_feedback_seconds": t2 - t1, "class_exports_seconds": t3 - t2,
              "class_seconds": t3 - t0, "feedback_pages": len(pages), "passed": passed}
    result["targets_met"] = {"class_seconds": result["class_seconds"] <= 900.0} if not quick else {}
    return result


def report(result: dict) -> str:
    """A few lines for people."""
    lines = [f"a class of {result['students']} students x {len(result['labs'])} labs ({result['class_notebooks']} "
             f"notebooks), labkit grade --jobs {result['jobs']} on {result['cores']} cores"
             + ("" if result["isolated"] else " (no sandbox could be made here)"),
             f"  grading {result['class_grading_seconds']:.0f} s, feedback pages {result['class_feedback_seconds']:.0f} s, "
             f"exports {result['class_exports_seconds']:.1f} s: {result['class_seconds'] / 60:.1f} min in all",
             "  exercises passed by kind of student: " + ", ".join(f"{k} {a}/{b}" for k, (a, b) in result["passed"].items())]
    if "class_seconds" in result["targets_met"]:
        lines.append(f"class_seconds: {result['class_seconds']:.0f} s (target <= 900 for 40 students on 2 cores: "
                     f"{'met' if result['targets_met']['class_seconds'] else 'NOT met'})")
    return "\n".join(lines)
