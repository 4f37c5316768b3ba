"""Each lab notebook executed once per version in a test run, shared by every test that reads it.

The two versions are the instructor's (the solutions) and the student's as ``labkit assign`` hands it out. Each is
graded as ``labkit grade`` grades a class: on the quick profile, in the sandbox, with the release record, on the
default data (no LABKIT_DATA). The tests of tests/test_notebooks.py read a run's claims, figures and errors, and its
verdicts, from these runs. A version is graded when a test first asks for it, and only for the labs that the run's
selected tests read (``pytest -k 03`` grades lab 03 alone).

The instructor's notebooks run one at a time, beside the rest of the test run on the other workers: their claims
must hold on a machine that others share, as a class's does. The student versions run two at a time: only where
they fail matters, not how fast they run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from labkit import runner, settings

JOBS = {"reference": 1, "student": 2}
DATA = settings.SETTINGS["LABKIT_DATA"].name  # removed for the runs: the default data
CELL_LIMIT = 300  # seconds a cell may take, as runner.execute allows the report's cells


@dataclass
class LabRun:
    """One notebook's graded run: the executed notebook, its verdicts, what it recorded and claimed."""

    name: str
    executed: Path
    results: list          # labkit.grading.grade.ExerciseResult of this notebook
    entry: dict            # its grades.json entry: passed, exercises, seconds, ...
    isolated: bool         # whether it ran in a sandbox
    released: int          # the exercises the release record holds for it
    found: runner.NotebookResult = field(default=None)

    @property
    def seconds(self) -> float:
        return float(self.entry.get("seconds", 0.0))


class LabRuns:
    def __init__(self, folder: Path, names: set[str]):
        self.folder, self.names = Path(folder), set(names)
        self.notebooks = [p for p in runner.find_notebooks() if p.name in self.names]
        self._graded: dict[str, dict[str, LabRun]] = {}
        self._release: Path | None = None

    def get(self, version: str, name: str) -> LabRun:
        """The run of notebook ``name`` in ``version`` ("reference" or "student"), graded on first use."""
        if name not in self.names:  # a test selected after collection (a plugin, a rerun): grade it as well
            self.names.add(name)
            self.notebooks = [p for p in runner.find_notebooks() if p.name in self.names]
            self._graded.clear()  # every version again, from a release that holds it too
            self._release = None
        if version not in self._graded:
            self._graded[version] = self._grade(version)
        return self._graded[version][name]

    def _handout(self) -> Path:
        from labkit.grading import assign  # the grader, imported when a test first needs a run, not by every collection

        if self._release is None:
            self._release = self.folder / "release"
            assign.write_student_versions(self.notebooks, self.folder / "handout", release_dir=self._release, force=True)
        return self.folder / "handout"

    def _grade(self, version: str) -> dict[str, LabRun]:
        import nbformat

        from labkit.grading import grade

        handout = self._handout()
        subs = self.folder / version / "subs" / version
        subs.mkdir(parents=True, exist_ok=True)
        for path in self.notebooks:
            source = path if version == "reference" else handout / path.name
            nbformat.write(nbformat.read(source, as_version=4), subs / path.name)
        out = self.folder / version / "out"
        saved = os.environ.pop(DATA, None)  # the default data, as a student's first run has it
        try:
            results, _, json_path = grade.grade(subs.parent, out, timeout=CELL_LIMIT, progress=False,
                                                jobs=JOBS[version], release=self._release)
        finally:
            if saved is not None:
                os.environ[DATA] = saved
        data = json.loads(json_path.read_text())
        record = json.loads((self._release / "release.json").read_text())["notebooks"]
        runs = {}
        for path in self.notebooks:
            executed = out / "executed" / version / path.name
            run = LabRun(path.name, executed, [r for r in results if r.notebook == path.name],
                         data["students"][version][path.name], bool(data.get("isolated")),
                         len(record[path.name]["exercises"]))
            run.found = runner.NotebookResult(name=path.name, title=path.stem)
            if executed.exists():
                runner.collect(nbformat.read(executed, as_version=4), run.found)
            runs[path.name] = run
        return runs
