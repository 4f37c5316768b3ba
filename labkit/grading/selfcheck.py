"""A student's check before handing in: the grader's own run of their notebook, by the grader's rules.

    labkit check-submission 07_ring_allreduce.ipynb

or, from a notebook cell (it checks the file as last saved)::

    from labkit.grading import check_submission
    check_submission("07_ring_allreduce.ipynb")

The notebook runs as ``labkit grade`` runs it: top to bottom in a fresh kernel on the quick profile, each cell
under the same time limit, the checks' records replayed in this process for the verdict, in a sandbox where one can
be made here (bubblewrap, as root or with user namespaces) and otherwise with the student's own rights, which it
says. It reports "public checks passed: k of n" and never more: the instructor may grade with hidden checks too,
which no copy handed out can show. It names the written answers left blank: each is 0 points as it stands.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..check import capture
from . import sandbox
from .answers import Answer, blank_answers, is_blank, meta
from .notebook import ExerciseResult


@dataclass
class SelfCheck:
    """What the grader's run of one notebook said."""

    notebook: Path
    results: list[ExerciseResult] = field(default_factory=list)
    isolated: bool = False
    why_not_isolated: str = ""
    seconds: float = 0.0
    skipped: str = ""
    blank: list[Answer] = field(default_factory=list)  # written answers left blank
    answers: int = 0  # written answers the notebook asks for

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    def report(self) -> str:
        if self.skipped:
            return self.skipped
        saved = time.strftime("%H:%M:%S", time.localtime(self.notebook.stat().st_mtime))
        where = "" if self.isolated else (f"; NOT isolated ({self.why_not_isolated}): it ran with your own rights, "
                                          "as in JupyterLab")
        lines = [f"{self.notebook.name}, as last saved at {saved}, run as the grader runs it ({self.seconds:.0f} s)"
                 + where]
        for r in self.results:
            lines.append(f"  {'✔' if r.passed else '✘'} {r.exercise}" + ("" if r.passed else f": {r.message}"))
        lines.append(f"public checks passed: {self.passed} of {len(self.results)}. The grader may also run hidden "
                     "checks, which no copy handed out can show: this is not a grade.")
        if self.blank:
            listed = ", ".join(f"{a.question} ({a.points} point{'s' if a.points != 1 else ''}"
                               + (f", {a.note}" if a.note else "") + ")" for a in self.blank)
            lines.append(f"written answers left blank, 0 points each as they stand: {listed}. Write them in their "
                         "answer cells before handing in.")
        elif self.answers:
            lines.append(f"written answers: all {self.answers} written; your instructor reads and scores them.")
        return "\n".join(lines)


def check_submission(notebook: Path | str, timeout: int = 60, profile: str = "quick", release: Path | str | None = None,
                     isolate: bool | None = None, quiet: bool = False) -> SelfCheck:
    """Grade ``notebook`` (the saved file) by the grader's rules and print what it said; returns the results.

    Inside a grading run (the notebook calling this is itself being graded) it does nothing: a notebook that checks
    itself would run itself again and again."""
    import nbformat

    from .grade import load_release, released_name
    from .notebook import grade_notebook, unreadable

    path = Path(notebook).expanduser()
    if capture.ENV in os.environ:
        result = SelfCheck(path, skipped="check_submission: skipped while the notebook is being graded")
        if not quiet:
            print(result.report())
        return result
    if not path.is_file():
        raise FileNotFoundError(f"no notebook at {path}: give the path of your saved .ipynb file")
    why = unreadable(path)
    if why:
        raise ValueError(f"{path.name}: {why}")
    ok, reason = sandbox.available()
    isolated = ok if isolate is None else (isolate and ok)
    if isolate and not ok:
        raise RuntimeError(f"cannot isolate the notebook here: {reason}")
    record, _ = load_release(release)
    released = record["notebooks"][name] if record and (name := released_name(path, record)) else None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-selfcheck-") as tmp:
        results = grade_notebook(path, "you", Path(tmp), timeout, profile, released, isolate=isolated)
    result = SelfCheck(path, results, isolated, "" if isolated else (reason if not ok else "turned off"),
                       time.perf_counter() - t0)
    nb = nbformat.read(path, as_version=4)
    result.blank = blank_answers(nb, released)
    result.answers = len(result.blank) + sum(1 for c in nb.cells if meta(c) is not None and not is_blank(c))
    if not quiet:
        print(result.report(), file=sys.stdout)
    return result
