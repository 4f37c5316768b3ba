"""Grading a class: every student's notebooks, each run and judged by :mod:`.notebook`, into one set of grades.

    labkit grade submissions/ --release release/ --lab 01 --out grades/

``submissions/`` holds one folder per student (``alice/05_cuda_kernels.ipynb``...; ``labkit collect`` writes it from
an LMS's download) or the notebooks themselves (the file name then names the student). Each notebook is the lab its
content says (its check cells and answer cells), never what its file is called: a renamed download still grades as
its lab, and a student's two files of one lab are never graded as two (the newest is kept, and the run says so).
Every notebook runs from top to bottom on the quick profile; a cell that errs or runs past ``timeout`` seconds is
stopped and the notebook goes on, so one endless loop costs one exercise, never the rest of the notebook or the other
students. An exercise is a check cell, ``check.<name>(...)`` of an exercise declared in :mod:`labkit.check.exercises`:
its verdict is the check's, replayed by the grader on what the student's function returned (never the cell's own
success). Results go to ``grades.csv`` (one row per exercise, with its points, the lab's late penalty, and an open
exercise's score and rank in the class) and ``grades.json`` (with each lab's points, :mod:`.scores`), and the executed
notebooks beside them. The answers to the labs' questions (:mod:`.answers`) go to ``answers.html`` and
``answers.csv``, whose ``score`` column the instructor fills in; ``labkit grade --rescore OUT`` then totals them
without running a notebook again. What a sandbox contained (a write outside the notebook's folder, a connection beyond
loopback...: :mod:`.audit`) is each lab's ``escapes`` in ``grades.json``, and ``escapes.csv`` when there is any.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import __version__
from ..check.exercises import EXERCISES
from ..errors import LabkitError
from ..labs import NOTEBOOKS
from ..machine import usable_cores
from ..progress import progress_bar
from . import answers as answer_cells
from . import audit, late, sandbox, scores, workers
from .assign import CHECK_CALL, RELEASE_FILE, entry_lab, exercises_in, lab_number, lab_of, read_release
from .notebook import ExerciseResult, grade_notebook, rows_of
from .sandbox import Limits


def load_release(release: Path | str | None) -> tuple[dict | None, str | None]:
    """The release record written by ``labkit assign --release DIR`` and its sha256, from ``release`` (the release.json
    or its folder); (None, None) without one. (The command line's default, ./release when it is there, is the command
    line's: a folder left in the working directory never changes what the library grades.)"""
    if release is None:
        return None, None
    path = Path(release)
    if path.is_dir():
        path = path / RELEASE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no release record at {path}: `labkit assign --release DIR` writes DIR/{RELEASE_FILE}")
    return read_release(path)


def only_labs(record: dict, labs: set[str]) -> dict:
    """The release record with only the notebooks of ``labs`` ("01", "07"); a lab it does not hold is refused."""
    kept = {name: entry for name, entry in record["notebooks"].items() if entry_lab(name, entry) in labs}
    missing = sorted(labs - {entry_lab(n, e) for n, e in kept.items()})
    if missing:
        held = ", ".join(sorted(filter(None, (entry_lab(n, e) for n, e in record["notebooks"].items()))))
        raise ValueError(f"--lab {','.join(missing)}: the release holds no such lab (it holds {held})")
    return {**record, "notebooks": kept}


def submissions(folder: Path) -> list[tuple[str, Path]]:
    """(student, notebook) pairs: folder/<student>/*.ipynb, and folder/*.ipynb named by their file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no submissions folder at {folder}")
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        rel = path.relative_to(folder)
        found.append((rel.parts[0] if len(rel.parts) > 1 else path.stem, path))
    if not found:
        raise FileNotFoundError(f"no notebooks (*.ipynb) under {folder}")
    return found


def _read(path: Path):
    import nbformat

    try:
        return nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable file is reported when it is run
        return None


def lab_notebook(lab: str) -> str:
    """The file name of a lab's notebook in the course (``01_serial_backprop.ipynb``), which names its rows."""
    found = sorted(Path(NOTEBOOKS).glob(f"{lab}_*.ipynb"))
    return found[0].name if found else f"{lab}.ipynb"


def released_name(path: Path, record: dict) -> str | None:
    """The released notebook a submission is: the one of the lab its content shows; else (a notebook whose check and
    answer cells name no lab) the one most of whose check cells it holds, by id and by the check they call, else the
    released notebook whose name it kept; an unreadable file, the release's only lab. None: none of the release's."""
    nb = _read(path)
    lab = lab_of(nb) if nb is not None else None
    by_lab = {entry_lab(name, entry): name for name, entry in record["notebooks"].items()}
    if lab is not None:
        return by_lab.get(lab)
    if nb is not None:
        cells = {c.get("id"): c.get("source", "") for c in nb.cells}

        def holds(ex: dict) -> bool:
            source = cells.get(ex["check_cell_id"])
            return source is not None and f"check.{ex['name'].split('#')[0]}(" in source

        score = {name: sum(holds(ex) for ex in entry["exercises"]) for name, entry in record["notebooks"].items()}
        best = max(score, key=score.get, default=None)
        if best is not None and score[best] > 0:
            return best
    if path.name in record["notebooks"]:  # nothing in it says which lab (check cells deleted?): the name it kept
        return path.name
    if nb is None and len(record["notebooks"]) == 1:  # an empty upload of the only lab: its rows say what is wrong
        return next(iter(record["notebooks"]))
    return None


def notebook_name(path: Path, record: dict | None) -> str | None:
    """The lab notebook a submitted file is (its rows are named by it): in the release, else in the course's
    notebooks; a notebook that shows no lab keeps its file's name without a release, and is None with one."""
    if record is not None:
        return released_name(path, record)
    nb = _read(path)
    lab = lab_of(nb) if nb is not None else None
    return lab_notebook(lab) if lab else path.name


@dataclass(frozen=True)
class Handed:
    """One notebook to grade: whose, which file, and the lab notebook it is."""
    student: str
    path: Path
    name: str


def place(found: list[tuple[str, Path]], record: dict | None, labs: set[str] | None) -> list[Handed]:
    """Each submitted file named by the lab it is; files of other labs than ``labs`` left out; of one student's two
    files of one lab the newest kept (said on stderr), so that a lab is never graded in two halves."""
    chosen: dict[tuple[str, str], Handed] = {}
    for student, path in found:
        name = notebook_name(path, record)
        if name is None:
            print(f"labkit grade: {path}: not graded, it is none of the release's labs (its check and answer cells "
                  "name no lab the release holds)", file=sys.stderr)
            continue
        if labs and (lab_number(name) or "") not in labs:
            continue
        here = Handed(student, path, name)
        other = chosen.get((student, name))
        if other is not None:
            keep, drop = sorted([other, here], key=lambda h: (h.path.stat().st_mtime, str(h.path)))[::-1]
            print(f"labkit grade: {student} handed in {name} twice ({drop.path.name} and {keep.path.name}): grading "
                  f"the newer, {keep.path}", file=sys.stderr)
            here = keep
        chosen[(student, name)] = here
    return sorted(chosen.values(), key=lambda h: (h.student, h.name))


@dataclass(frozen=True)
class GradeOptions:
    """How every notebook of a run is graded: the limit per cell, the profile, BLAS and OpenMP threads per kernel,
    isolation, the sandbox's limits and the exercises with a hidden part."""
    timeout: int = 60
    profile: str = "quick"
    threads: int | None = None
    isolate: bool | None = None
    limits: Limits | None = None
    hidden_parts: frozenset[str] = field(default_factory=frozenset)


def _grade_one(work: tuple[Handed, Path, dict | None, GradeOptions]) -> tuple[list[ExerciseResult], float, str, list]:
    """One submission (in a worker process with --jobs): its results, its seconds, the file's sha256 and the escape
    attempts its sandbox contained."""
    handed, out_dir, released, o = work
    t0 = time.perf_counter()
    escapes: list[dict] = []
    results = grade_notebook(handed.path, handed.student, out_dir, o.timeout, o.profile, released, o.threads, o.isolate,
                             o.limits, o.hidden_parts, name=handed.name, escapes=escapes)
    return results, time.perf_counter() - t0, hashlib.sha256(Path(handed.path).read_bytes()).hexdigest(), escapes


def share_cores(jobs: int, cores: int) -> tuple[int, int | None]:
    """(notebooks graded at once, BLAS and OpenMP threads for each kernel, None for its default) for ``jobs`` asked on
    ``cores`` usable cores: never more notebooks at once than cores, so that no notebook gets less than a core of
    its own, and each an equal share. Says what it did on stderr when it asked for several."""
    if jobs == 1:
        return 1, None
    took = min(jobs, cores)
    threads = max(1, cores // took)
    cut = f" (not {jobs}: only {cores} cores are usable here, and a notebook gets at least one)" if took < jobs else ""
    print(f"labkit grade: --jobs {jobs}: {took} notebooks at a time{cut}, each kernel's BLAS and OpenMP threads set to "
          f"{threads} of the {cores} cores", file=sys.stderr)
    return took, threads


def grade(folder: Path | str, out: Path | str = "grades", timeout: int = 60, profile: str = "quick",
          progress: bool | None = None, release: Path | str | None = None,
          jobs: int = 1, isolate: bool | None = None, limits: Limits | None = None,
          part: tuple[int, int] | None = None, resume: bool = False, hidden_parts: Iterable[str] = (),
          labs: Iterable[str] | None = None, submitted: Path | str | None = None,
          extensions: Path | str | None = None) -> tuple[list[ExerciseResult], Path, Path]:
    """Grade every notebook under ``folder``; write ``grades.csv`` and ``grades.json`` into ``out``.

    With a release record (``release``), every exercise of every released notebook is graded for every student, by
    the check cells as handed out: a missing, edited or converted check cell fails and says so, and a notebook a
    student did not hand in fails all its exercises. ``labs`` ("01", "07") grades only those labs: the grades, the
    answers and everything made from them hold no other.

    ``submitted`` is the submissions.csv of ``labkit collect`` (``folder``/submissions.csv when there): the time each
    lab was handed in, from which the release's deadline and late policy (with ``extensions``, a CSV, :mod:`.late`)
    give its penalty. Points come from the release (:mod:`.scores`).

    ``jobs`` > 1 grades that many submissions at once (worker processes), each kernel's BLAS and OpenMP threads set
    to its share of the cores; the results are the same, in the same order.

    Each notebook runs in a sandbox of its own under ``limits`` (:mod:`labkit.grading.sandbox`): bubblewrap's, else
    (as root) an unprivileged user of its own. Where neither can be made, grading refuses; ``isolate=False``
    (``--no-sandbox``) grades with no isolation on purpose, after a warning, and the grades say so.

    ``part=(k, n)`` grades only the k-th of n shares of the students (k = 0 .. n-1, every n-th student in name order):
    one share per task of a SLURM array, say, each into its own ``out``, put together by :func:`merge`.

    Each notebook's results are kept in ``out``/.progress as soon as it is graded. An interrupted run (Ctrl-C, or
    SIGTERM, which is taken as Ctrl-C) stops its workers and every sandbox, kernel and engine they started, writes no
    grades, and raises KeyboardInterrupt; ``resume=True`` then grades only what it had not finished (a notebook
    changed since is graded again), with the same options.

    ``hidden_parts`` names exercises (or ``"all"``) whose checks also run, silently, on a second secret draw of
    inputs: each such exercise gets a second row, ``<name>~hidden``, a share of the exercise's points, whose message
    the feedback and the Gradescope export show only as "a hidden check failed"."""
    if timeout < 1:
        raise ValueError(f"timeout must be >= 1 second, got {timeout}")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    hidden_parts, wanted = _hidden_parts(hidden_parts), wanted_labs(labs)
    record, release_sha = load_release(release)
    full = record
    if record is not None and wanted:
        record = only_labs(record, wanted)
    found = _share(submissions(Path(folder)), part)
    handed = place(found, full, wanted)  # said before anything starts; another lab's notebook is no stranger
    everyone = sorted({student for student, _ in found})  # one whose files are all of other labs hands in nothing
    if not handed:
        raise FileNotFoundError(f"no notebook of lab {', '.join(sorted(wanted))} under {folder}")
    times = _times(Path(folder), submitted, extensions)
    isolate = _isolation(isolate)
    if record is None:
        print("labkit grade: no release record (labkit assign --release DIR): exercises are the check cells found in "
              "each submission, so a deleted or edited check cell goes unnoticed", file=sys.stderr)
    out = Path(out)
    jobs, threads = share_cores(jobs, usable_cores())
    options = GradeOptions(timeout, profile, threads, isolate, limits, hidden_parts)
    run = {"profile": profile, "timeout_s": timeout, "release_sha256": release_sha, "release": _folder(release),
           "part": list(part) if part else None,
           "limits": asdict(limits or Limits()), "isolated": bool(isolate),
           "isolation": sandbox.kind() if isolate else "none", "hidden_parts": sorted(hidden_parts),
           "labs": sorted(wanted) or None, "jobs": jobs, "threads_per_notebook": threads,
           "usable_cores": usable_cores()}
    earlier = _earlier(out)  # read before grading: a grades.json that cannot be read stops the run first
    kept = _Progress(out, run, resume)
    work = [(h, out / "executed" / h.student, record["notebooks"][h.name] if record else None, options) for h in handed]
    results: list[ExerciseResult] = []
    seconds, hashes, escapes = {}, {}, {}
    with _sigterm_as_interrupt():
        graded = _grade_all(work, jobs, progress, kept)
    for h, (mine, secs, digest, tried) in zip(handed, graded):
        results += mine
        seconds[(h.student, h.name)], hashes[(h.student, h.name)], escapes[(h.student, h.name)] = secs, digest, tried
    if record:
        missing = _not_handed_in(handed, record, hidden_parts, everyone)
        results += missing
        seconds.update({(r.student, r.notebook): 0.0 for r in missing})
    scores.set_points(results, record, hidden_parts)
    answered = _answers(handed, record, out, everyone, _rubrics(release, full), set(seconds), full)
    students = _by_student(results, seconds, hashes, escapes)
    _add_answers(students, answered)
    _add_late(students, record, times)
    students = _keep_earlier(earlier.get("students", {}), students, out)
    # each notebook's release entry, as graded: the kept grades' from their run, this run's for what it graded
    graded_now = {nb for _, nb in seconds}  # every (student, notebook) this run graded, handed in or not
    run["release_notebooks"] = {**{nb: h for nb, h in (earlier.get("release_notebooks") or {}).items()
                                   if nb not in graded_now}, **{nb: h for nb, h in notebook_hashes(record).items()
                                                                 if nb in graded_now or not earlier}}
    meta = {**run, "labkit_version": __version__, "graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if run["labs"] and set(run["labs"]) != (held := {e.get("lab") for per in students.values() for e in per.values()}):
        meta["labs"] = sorted(held - {None})  # every lab the folder's grades hold, those kept from earlier runs too
    csv_path, json_path = _write(out, {**meta, "students": students})
    kept.finish()
    return results, csv_path, json_path


def wanted_labs(labs: Iterable[str] | None) -> set[str]:
    """The lab numbers of ``--lab 01,7``, as "01", "07"; a name that is no lab number is refused."""
    wanted = set()
    for given in labs or ():
        for name in str(given).split(","):
            if name.strip():
                number = lab_number(name)
                if number is None:
                    raise ValueError(f"--lab {name.strip()!r} is no lab number: give 01 ... 12, e.g. --lab 01,07")
                wanted.add(number)
    return wanted


def _times(folder: Path, submitted: Path | str | None, extensions: Path | str | None) -> tuple[dict, dict]:
    """The submission times (submissions.csv, given or in the submissions folder) and the extensions."""
    if submitted is None and (folder / "submissions.csv").is_file():
        submitted = folder / "submissions.csv"
    return (late.read_submissions(submitted) if submitted else {},
            late.read_extensions(extensions) if extensions else {})


def _add_late(students: dict, record: dict | None, times: tuple[dict, dict]) -> None:
    """Each lab's submission (time, LMS ids) and late penalty, from the release's deadline and policy; then its total."""
    submitted, extensions = times
    groups = late.groups(submitted)  # a group hands in once: one deadline, its most generous member's
    for student, per in students.items():
        for nb, entry in per.items():
            lab = lab_number(nb) or ""
            row = submitted.get((student, lab))
            if row:
                entry["submission"] = {k: row[k] for k in late.SUBMISSIONS_FIELDS if k != "student"}
            released = (record or {}).get("notebooks", {}).get(nb, {})
            deadline = late.deadline_for(released, student, lab, extensions, groups.get((student, lab), ()))
            when = late.parse_time(row["submitted_at"], "submitted_at") if row and row["submitted_at"] else None
            handed_in = any(r["message"] != "notebook not handed in" for r in entry.get("results", []))
            entry["late"] = late.penalty(when if handed_in else None, deadline if handed_in else None,
                                         released.get("late"))
            if deadline is not None and when is None and handed_in:
                print(f"labkit grade: {student}, {nb}: no submission time (give --submissions, the submissions.csv of "
                      "labkit collect): no late penalty applied", file=sys.stderr)
            scores.total(entry)


def _earlier(out: Path) -> dict:
    """The grades an earlier run left in ``out`` ({} without), read before this run grades anything."""
    path = out / "grades.json"
    if not path.is_file():
        return {}
    try:
        return _load_grades(path)
    except ValueError as e:
        raise ValueError(f"{e}: move it out of {out}, or grade into another --out") from None


def notebook_hashes(record: dict | None) -> dict[str, str]:
    """Each released notebook's entry's sha256 (its check cells, points, deadline): two runs agree on a lab where its
    entry is the same, whatever other labs the release record holds by then."""
    return {name: hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()
            for name, entry in (record or {}).get("notebooks", {}).items()}


WHOLE_RELEASE = "release_sha256 (the whole release record)"


def release_words(differ: list[str]) -> str:
    """What :func:`release_differs` found, in words."""
    return differ[0] if differ == [WHOLE_RELEASE] else f"the release entry of {', '.join(differ)}"


def release_differs(a: dict, b: dict) -> list[str]:
    """The notebooks graded in both grades.json ``a`` and ``b`` whose release entries differ (``b`` without students:
    a run about to grade, its ``release_notebooks`` those of its record); ["the release"] for grades that hash only
    the whole record (or none) and differ in it."""
    ha, hb = a.get("release_notebooks"), b.get("release_notebooks")
    if not ha or not hb:
        return [] if a.get("release_sha256") == b.get("release_sha256") else [WHOLE_RELEASE]
    both = _graded(a) & (_graded(b) if "students" in b else set(hb))
    return sorted(nb for nb in both if ha.get(nb) != hb.get(nb))


def _graded(data: dict) -> set[str]:
    return {nb for per in data.get("students", {}).values() for nb in per}


def _keep_earlier(earlier: dict, students: dict, out: Path) -> dict:
    """``students`` with the grades an earlier run left in ``out`` of what this run did not grade (another lab, other
    students) put back, so that a week's labs graded one at a time into one folder all stay; says what it kept."""
    kept = {(s, nb): entry for s, per in earlier.items() for nb, entry in per.items() if nb not in students.get(s, {})}
    if not kept:
        return students
    for (student, nb), entry in kept.items():
        students.setdefault(student, {})[nb] = entry
    labs = sorted({entry.get("lab") or lab_number(nb) or nb for (_, nb), entry in kept.items()})
    print(f"labkit grade: {out} held earlier grades of lab {', '.join(labs)} ({len({s for s, _ in kept})} student(s)) "
          "that this run did not grade: kept beside this run's, which replace only what it graded (to start afresh, "
          "grade into another --out)", file=sys.stderr)
    return {s: dict(sorted(per.items())) for s, per in sorted(students.items())}


PROGRESS = ".progress"


class _Progress:
    """The results of the notebooks graded so far in a run, one file each in ``out``/.progress, so that an
    interrupted run can be resumed; removed when the run has written its grades."""

    MACHINE = ("jobs", "threads_per_notebook", "usable_cores")  # how it ran, not what it graded: may change

    def __init__(self, out: Path, options: dict, resume: bool):
        self.folder = Path(out) / PROGRESS
        self.options = {k: v for k, v in json.loads(json.dumps(options)).items() if k not in self.MACHINE}
        run = self.folder / "run.json"
        if resume:
            if not run.is_file():
                raise FileNotFoundError(f"nothing to resume in {out}: no interrupted labkit grade run left "
                                        f"{self.folder} (run without --resume)")
            earlier = json.loads(run.read_text())
            if earlier != self.options:
                differ = ", ".join(k for k in self.options if earlier.get(k) != self.options[k])
                raise ValueError(f"the interrupted run in {out} graded with other options ({differ}): resume with "
                                 "the same options, or run without --resume to start again")
        else:
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        run.write_text(json.dumps(self.options))

    def _file(self, student: str, path: Path) -> Path:
        return self.folder / (hashlib.sha256(f"{student}\0{Path(path).name}".encode()).hexdigest()[:24] + ".json")

    def get(self, student: str, path: Path) -> tuple[list[ExerciseResult], float, str, list] | None:
        """The results kept for this notebook (with its escape attempts), if it is unchanged since it was graded."""
        f = self._file(student, path)
        try:
            kept = json.loads(f.read_text())
            if kept["sha256"] != hashlib.sha256(Path(path).read_bytes()).hexdigest():
                return None
            return ([ExerciseResult(**r) for r in kept["results"]], float(kept["seconds"]), kept["sha256"],
                    list(kept.get("escapes", [])))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, student: str, path: Path, item: tuple[list[ExerciseResult], float, str, list]) -> None:
        mine, secs, digest, escapes = item
        f = self._file(student, path)
        tmp = f.with_suffix(".part")
        tmp.write_text(json.dumps({"student": student, "notebook": Path(path).name, "sha256": digest, "seconds": secs,
                                   "results": [asdict(r) for r in mine], "escapes": escapes}))
        tmp.replace(f)

    def finish(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class _sigterm_as_interrupt:
    """SIGTERM (a kill, a scheduler's time limit) handled as Ctrl-C: the run unwinds, stopping what it started."""

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _folder(release: Path | str | None) -> str | None:
    """The release's folder, absolute (grades.json keeps it, so that --rescore reads the rubrics edited since)."""
    if release is None:
        return None
    path = Path(release).resolve()
    return str(path if path.is_dir() else path.parent)


def _rubrics(release: Path | str | None, record: dict | None) -> dict | None:
    """The release's rubrics (RELEASE/rubrics.json, written from the defaults when missing); None without a release.
    A release folder that cannot be written to gets the defaults, unsaved, and says so."""
    if release is None or record is None:
        return None
    try:
        return answer_cells.load_rubrics(_folder(release), record)
    except OSError as e:
        print(f"labkit grade: the rubrics could not be written into {_folder(release)} ({e}): using the defaults",
              file=sys.stderr)
        return answer_cells.default_rubrics(record)


def _answers(handed: list[Handed], record: dict | None, out: Path, everyone: list[str],
             rubrics: dict | None = None, graded: set | None = None, full: dict | None = None) -> list[answer_cells.Answer]:
    """Every student's answers to the questions (a blank one scores 0, and says so), with the scores, rubric items and
    comments an earlier run's answers.csv in ``out`` holds for answers unchanged since, written to answers.csv and
    answers.html beside the release's rubrics (``full``'s, the whole release). The earlier rows of the (student,
    notebook) pairs this run did not grade (``graded``) are written back as they were; only this run's are returned."""
    answered: list[answer_cells.Answer] = []
    prompts: dict[tuple[str, str], str] = {}
    for h in handed:
        entry = record["notebooks"].get(h.name) if record else None
        nb = _read(h.path)
        mine, why = {}, "the notebook could not be read"
        if nb is not None:
            try:
                mine = {a.question: a for a in answer_cells.collect(nb, h.student, h.name)}
                prompts.update({(h.name, m["answer"]): answer_cells.question_text(nb, i)
                                for i, c in enumerate(nb.cells) if (m := answer_cells.meta(c)) is not None})
                why = "its answer cell is missing from the notebook (deleted?)"
            except Exception as e:  # noqa: BLE001 - a malformed answer cell: its answers are blank, said why
                why = f"the answer cells could not be read ({type(e).__name__})"
        for q in entry.get("answers", []) if entry else []:
            answered.append(mine.pop(q["id"], None) or answer_cells.Answer(
                h.student, h.name, q["id"], q["kind"], int(q["points"]), "", True, note=why))
        answered += list(mine.values())
    if record:  # a released notebook a student did not hand in: its questions unanswered
        done = {(h.student, h.name) for h in handed}
        for student in everyone:
            for name, entry in record["notebooks"].items():
                if (student, name) not in done:
                    answered += [answer_cells.Answer(student, name, q["id"], q["kind"], int(q["points"]), "", True,
                                                     note="notebook not handed in") for q in entry.get("answers", [])]
    for name, entry in (full or record or {}).get("notebooks", {}).items():
        prompts.update({(name, q["id"]): q.get("question", "") for q in entry.get("answers", [])})
    for a in answered:
        if a.blank:
            a.score, a.note = 0.0, a.note or scores.BLANK_NOTE
    this_run = len(answered)
    if graded is not None:  # another lab's (or student's) answers from an earlier run into this folder stay
        answered += [a for a in answer_cells.read(out / answer_cells.ANSWERS_CSV)
                     if (a.student, a.notebook) not in graded]
    for warning in answer_cells.merge_scores(answered, out / answer_cells.ANSWERS_CSV, rubrics):
        print(f"labkit grade: answers.csv: {warning}", file=sys.stderr)
    if answered:
        answer_cells.write(out, answered, prompts, rubrics)
    return answered[:this_run]


def _add_answers(students: dict, answered: list) -> None:
    """grades.json: per student and notebook, its answers, the points scored so far and each answer's comment."""
    by: dict[tuple[str, str], list[dict]] = {}
    for a in answered:
        row = {"question": a.question, "kind": a.kind, "points": a.points, "blank": a.blank, "score": a.score}
        if a.note:
            row["note"] = a.note
        if a.items:
            row["items"] = a.items
        if a.comment:
            row["comment"] = a.comment
        by.setdefault((a.student, a.notebook), []).append(row)
    for (student, nb), rows in by.items():
        entry = students.setdefault(student, {}).setdefault(nb, {"passed": 0, "exercises": 0, "results": [],
                                                                 "escapes": []})
        scores.answers_into(entry, rows)


class NoSandbox(LabkitError, RuntimeError):
    """No sandbox can be made here, and grading without one was not asked for."""


def _isolation(isolate: bool | None) -> bool:
    """Whether the notebooks run in sandboxes: always (None, True), where NoSandbox names what is missing and the way
    out, or not, on purpose (False), said on stderr."""
    if isolate is None or isolate:
        ok, why = sandbox.available()
        if not ok:
            raise NoSandbox(f"labkit grade: cannot isolate the submissions: {why}. Grading runs students' code: install "
                            "bubblewrap, or grade as root (each notebook then runs as an unprivileged user of its own), "
                            "or give --no-sandbox to grade with no isolation on purpose (the grades say so)")
        print(f"labkit grade: each notebook isolated by {sandbox.DESCRIBED[sandbox.kind()]}", file=sys.stderr)
        return True
    print("labkit grade: WARNING: isolation turned off (--no-sandbox): the submissions' code runs with your rights and "
          "can read and write what you can; the grades say so", file=sys.stderr)
    return False


def _share(found: list[tuple[str, Path]], part: tuple[int, int] | None) -> list[tuple[str, Path]]:
    """The submissions of the k-th of n shares of the students (all of them without ``part``)."""
    if part is None:
        return found
    k, n_parts = part
    if not (isinstance(k, int) and isinstance(n_parts, int) and 0 <= k < n_parts):
        raise ValueError(f"part must be (k, n) with 0 <= k < n, got {part!r}")
    mine = set(sorted({s for s, _ in found})[k::n_parts])
    return [(s, p) for s, p in found if s in mine]


def _grade_all(work: list[tuple], jobs: int, progress: bool | None,
               kept: _Progress | None = None) -> list[tuple[list[ExerciseResult], float, str, list]]:
    """:func:`_grade_one` of every submission, in their order: here, or in ``jobs`` worker processes. What ``kept``
    holds of an interrupted run is not graded again; what is graded is kept as soon as it is."""
    done: dict[int, tuple] = {}
    for k, (handed, *_) in enumerate(work):
        if kept is not None and (item := kept.get(handed.student, handed.path)) is not None:
            done[k] = item
    todo = [k for k in range(len(work)) if k not in done]
    with progress_bar(total=len(work), initial=len(done), enable=progress, desc="grading", unit="nb") as bar:
        def finished(k, item):
            done[k] = item
            if kept is not None:
                kept.put(work[k][0].student, work[k][0].path, item)
            bar.update(1)

        if jobs == 1:
            for k in todo:
                finished(k, _grade_one(work[k]))
        else:  # worker processes (:mod:`.workers`); map keeps the order
            pool = workers.pool(jobs)
            try:
                for k, item in zip(todo, pool.map(_grade_one, [work[k] for k in todo])):
                    finished(k, item)
            except BaseException:
                workers.stop(pool)
                raise
            pool.shutdown()
    return [done[k] for k in range(len(work))]


def _not_handed_in(handed: list[Handed], record: dict, hidden_parts, everyone: list[str]) -> list[ExerciseResult]:
    """A failed row for every exercise (and hidden part) of every released notebook a student did not hand in."""
    done = {(h.student, h.name) for h in handed}
    return [ExerciseResult(student, name, row, False, "notebook not handed in")
            for student in everyone for name, entry in record["notebooks"].items()
            if (student, name) not in done for ex in entry["exercises"] for row in rows_of(ex["name"], hidden_parts)]


def _hidden_parts(names: Iterable[str]) -> frozenset[str]:
    """The exercises to grade with a hidden part: declared exercises, or "all"; a name labkit does not know is refused."""
    wanted = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(n for n in wanted if n != "all" and n not in EXERCISES)
    if unknown:
        raise ValueError(f"--hidden-part: {', '.join(unknown)} is no exercise labkit knows (they are the names of the "
                         "check calls, check.<name>(...), e.g. ring_allreduce), or give all")
    return wanted


def _by_student(results: list[ExerciseResult], seconds: dict, hashes: dict, escapes: dict | None = None) -> dict:
    """grades.json's students: per student and notebook, the lab, what passed, the seconds, the file's sha256, rows,
    and the escape attempts its sandbox contained (:mod:`.audit`)."""
    summary: dict = {}
    for (student, nb_name), secs in sorted(seconds.items()):
        mine = [r for r in results if r.student == student and r.notebook == nb_name]
        summary.setdefault(student, {})[nb_name] = {
            "lab": lab_number(nb_name), "passed": sum(r.passed for r in mine), "exercises": len(mine),
            "seconds": round(secs, 1), "results": [asdict(r) for r in mine],
            "escapes": list((escapes or {}).get((student, nb_name), []))}
    for (student, nb_name), digest in hashes.items():
        summary[student][nb_name]["sha256"] = digest
    return summary


CSV_FIELDS = ("student", "notebook", "exercise", "passed", "message", "points", "score", "lab", "submitted_at",
              "days_late", "penalty_percent", "performance", "performance_rank")


def _write(out: Path, data: dict) -> tuple[Path, Path]:
    """grades.csv (a row per exercise, with its points, its lab's late penalty, and an open exercise's score and rank
    in the class) and grades.json, each written whole or not at all (a temporary file renamed into place)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "grades.csv", out / "grades.json"
    boards = scores.leaderboards(data)
    with open(csv_path.with_suffix(".csv.part"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for student, per in data["students"].items():
            for nb, entry in per.items():
                when = (entry.get("submission") or {}).get("submitted_at", "")
                penalty = entry.get("late") or {}
                for r in entry.get("results", []):
                    points = float(r.get("points", 1))
                    w.writerow([student, nb, r["exercise"], int(r["passed"]), r["message"], f"{points:g}",
                                f"{scores.scored(r):g}", entry.get("lab") or lab_number(nb) or "", when,
                                penalty.get("days_late", 0), f"{float(penalty.get('percent', 0)):g}",
                                *_ranked_cells(boards, student, nb, r)])
    csv_path.with_suffix(".csv.part").replace(csv_path)
    _write_escapes(out, data)
    json_path.with_suffix(".json.part").write_text(json.dumps(data, indent=2) + "\n")
    json_path.with_suffix(".json.part").replace(json_path)
    return csv_path, json_path


def _ranked_cells(boards: dict, student: str, nb: str, row: dict) -> tuple[str, str]:
    """grades.csv's performance and performance_rank of a row: a passed open exercise's score and its rank in the
    class (1 the best, ties sharing one); blank for every other row."""
    perf = scores.performance(row)
    if perf is None:
        return "", ""
    return f"{float(perf['value']):g}", str(boards[(nb, row["exercise"])].rank_of(student))


ESCAPES_CSV = "escapes.csv"
ESCAPE_FIELDS = ("student", "notebook", "kind", "target", "count")


def _write_escapes(out: Path, data: dict) -> None:
    """escapes.csv, a row per escape attempt that a sandbox contained, when the grades hold any; an earlier one that
    they no longer hold is removed (the file says what grades.json says)."""
    rows = [(student, nb, e.get("kind", ""), e.get("target", ""), e.get("count", 1))
            for student, per in data["students"].items() for nb, entry in per.items()
            for e in entry.get("escapes") or []]
    path = out / ESCAPES_CSV
    if not rows:
        path.unlink(missing_ok=True)
        return
    with open(path.with_suffix(".csv.part"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(ESCAPE_FIELDS)
        w.writerows(rows)
    path.with_suffix(".csv.part").replace(path)


def escape_summary(data: dict, shown: int = 3) -> str:
    """One line naming each student whose sandbox contained escape attempts, with the first ``shown`` of them; ""
    where none did."""
    named = []
    for student, per in data.get("students", {}).items():
        tried = [e for entry in per.values() for e in entry.get("escapes") or []]
        if tried:
            words = [audit.describe(e) for e in tried[:shown]] + (["..."] if len(tried) > shown else [])
            named.append(f"{student} ({len(tried)}: {', '.join(words)})")
    if not named:
        return ""
    return (f"contained escape attempts: {'; '.join(named)} (every one in {ESCAPES_CSV}: a lead for you to read, "
            "not a verdict)")


def merge(parts: list[Path | str], out: Path | str) -> tuple[list[ExerciseResult], Path, Path]:
    """Put the grades of several runs (their output folders, or grades.json files) into one grades.csv and grades.json
    in ``out``: the ``--part`` shares of one class, or a class and a later run that regrades some of its students,
    whose grade of a lab replaces the earlier one (the later folder, given after). The runs must come from the same
    release and labkit version; two shares of one split may not both hold a student. Each kept grade's executed
    notebook comes with it, and every hand score, rubric item and comment of the runs' answers.csv whose answer has not
    changed since (a later run's own score wins). An ``out`` that holds other grades than the runs' is refused."""
    loaded = [(path, _load_grades(path)) for path in (_grades_file(p) for p in parts)]
    if not loaded:
        raise ValueError("nothing to merge: give the output folders of the labkit grade runs")
    for key in ("labkit_version", "profile", "hidden_parts"):
        values = {json.dumps(d.get(key)) for _, d in loaded}
        if len(values) > 1:
            raise ValueError(f"the runs differ in {key} ({', '.join(sorted(values))}): grade every part with the "
                             "same release, labkit version and options")
    for path, data in loaded[1:]:
        if differ := release_differs(loaded[0][1], data):
            raise ValueError(f"the runs differ in {release_words(differ)} ({loaded[0][0]} and {path}): "
                             "grade every part with the same release entries, labkit version and options")
    students: dict = {}
    owner: dict = {}
    for path, data in loaded:
        for student, notebooks in data["students"].items():
            for nb, entry in notebooks.items():
                earlier = owner.get((student, nb))
                if earlier is not None and _shares_of_one_split(earlier[1], data):
                    raise ValueError(f"{student} was graded in two shares of one split: {earlier[0]} and {path}")
                if earlier is not None:
                    print(f"labkit grade --merge: {student}, {nb}: the later grade ({path}) replaces {earlier[0]}",
                          file=sys.stderr)
                students.setdefault(student, {})[nb] = entry
                owner[(student, nb)] = (path, data)
    first = loaded[0][1]
    meta = {k: first.get(k) for k in ("profile", "timeout_s", "labkit_version", "release_sha256", "release", "limits",
                                      "hidden_parts", "labs")}
    meta["release_notebooks"] = {nb: h for _, d in loaded for nb, h in (d.get("release_notebooks") or {}).items()}
    meta["isolated"] = all(d.get("isolated") for _, d in loaded)
    meta["isolation"] = "+".join(sorted({str(d.get("isolation", "bubblewrap" if d.get("isolated") else "none"))
                                         for _, d in loaded}))
    meta["graded_at"] = max(str(d.get("graded_at", "")) for _, d in loaded)
    meta["parts"] = [{"grades": str(p), "part": d.get("part"), "graded_at": d.get("graded_at")} for p, d in loaded]
    merged = {s: dict(sorted(students[s].items())) for s in sorted(students)}
    _not_other_grades(Path(out), [p for p, _ in loaded])
    _copy_executed(owner, Path(out))
    data = {**meta, "students": merged}
    rubrics = _rescore_rubrics(None, data)
    if _merge_answers([p.parent for p, _ in loaded], Path(out), owner, rubrics):
        for warning in scores.rescore(data, Path(out), rubrics):  # grades.json's answers as answers.csv holds them
            print(f"labkit grade --merge: {warning}", file=sys.stderr)
    csv_path, json_path = _write(Path(out), data)
    return _rows(merged), csv_path, json_path


class WouldReplace(LabkitError, FileExistsError):
    """An output folder holds grades that the command would replace."""


def _not_other_grades(out: Path, merged: list[Path]) -> None:
    """Refuse to merge into a folder whose grades.json is none of the runs merged: it would be replaced whole."""
    there = out / "grades.json"
    if there.is_file() and there.resolve() not in {p.resolve() for p in merged}:
        raise WouldReplace(f"{out} already holds grades (grades.json) that are none of the runs merged, and --merge "
                           f"would replace them: merge them too, first (labkit grade --merge {out} ... --out {out}), "
                           "or choose another --out")


def _copy_executed(owner: dict, out: Path) -> None:
    """Each kept grade's executed notebook into ``out``/executed, from the run it was kept from: the feedback pages
    of the merged grades show it."""
    for (student, nb), (path, _) in owner.items():
        source, target = path.parent / "executed" / student / nb, out / "executed" / student / nb
        if source.is_file() and not (target.is_file() and target.samefile(source)):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _grades_file(p: Path | str) -> Path:
    path = Path(p) / "grades.json" if Path(p).is_dir() else Path(p)
    if not path.is_file():
        raise FileNotFoundError(f"no grades.json at {path}: give the --out folders of the labkit grade runs")
    return path


def _load_grades(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        data["students"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a grades.json written by labkit grade ({e})") from None
    return data


def _shares_of_one_split(a: dict, b: dict) -> bool:
    """Whether two runs are two shares (--part K/N) of the same N, which never hold one student twice."""
    return bool(a.get("part") and b.get("part") and a["part"][1] == b["part"][1] and a["part"] != b["part"])


def _merge_answers(folders: list[Path], out: Path, owner: dict, rubrics: dict | None) -> bool:
    """The merged runs' answers into ``out`` (answers.csv and answers.html): each student's lab from the run whose
    grade was kept, with the hand scores, items and comments of every run's answers.csv for an answer unchanged since,
    a later run's over an earlier's. False when no run has answers."""
    csvs = [folder / answer_cells.ANSWERS_CSV for folder in folders if (folder / answer_cells.ANSWERS_CSV).is_file()]
    if not csvs:
        return False
    answered = sorted((a for path in csvs for a in answer_cells.read(path)
                       if (kept := owner.get((a.student, a.notebook))) is not None and kept[0].parent == path.parent),
                      key=lambda a: (a.student, a.notebook))  # as the grades are, each's questions in their order
    warnings = [w for path in csvs for w in answer_cells.merge_scores(answered, path, rubrics)]  # in the runs' order
    for warning in dict.fromkeys(warnings):
        print(f"labkit grade --merge: answers.csv: {warning}", file=sys.stderr)
    answer_cells.write(out, answered, None, rubrics)
    return True


def _rows(students: dict) -> list[ExerciseResult]:
    return [ExerciseResult(**r) for per in students.values() for entry in per.values() for r in entry.get("results", [])]


def rescore(out: Path | str, release: Path | str | None = None) -> tuple[list[ExerciseResult], Path, Path, list[str]]:
    """Merge the hand scores, rubric items and comments of ``out``/answers.csv into ``out``'s grades (grades.json,
    grades.csv) without running a notebook again; returns the rows, the two files and the warnings. The items count
    by the rubrics of ``release``, else of the release the run was graded with (as edited since)."""
    out = Path(out)
    data = _load_grades(_grades_file(out))
    warnings = scores.rescore(data, out, _rescore_rubrics(release, data))
    csv_path, json_path = _write(out, data)
    return _rows(data["students"]), csv_path, json_path, warnings


def _rescore_rubrics(release: Path | str | None, data: dict) -> dict | None:
    """The rubrics --rescore counts items by: the release given (its defaults written when it has none), else the
    rubrics.json of the run's own release folder, when it is still there."""
    if release is not None:
        return answer_cells.load_rubrics(_folder(release))
    folder = data.get("release")
    if folder is None or not (Path(folder) / answer_cells.RUBRICS_FILE).is_file():
        return None
    return answer_cells.load_rubrics(folder)


def summary(results: list[ExerciseResult], data: dict | None = None) -> str:
    """One line per student and notebook, in grades.csv's figures (a row's score with partial credit), with ``data``
    (the grades.json written) its written answers, late penalty and total; then each failed exercise's message."""
    lines, by = [], {}
    for r in results:
        by.setdefault((r.student, r.notebook), []).append(r)
    for (student, nb_name), rs in by.items():
        got = sum(scores.scored({"score": r.score, "points": r.points, "passed": r.passed}) for r in rs)
        line = (f"{student:>16}  {nb_name}: {sum(r.passed for r in rs)}/{len(rs)} exercises passed, "
                f"{round(got, 4):g} of {sum(r.points for r in rs):g} points")
        lines.append(line + _beyond_exercises(((data or {}).get("students", {}).get(student) or {}).get(nb_name)))
        lines += [f"{'':>18}x {r.exercise}: {r.message}" for r in rs if not r.passed]
    return "\n".join(lines)


def _beyond_exercises(entry: dict | None) -> str:
    """A lab's written answers, late penalty and total, as its grades.json entry holds them ("" where it has none)."""
    if not entry or "total" not in entry:
        return ""
    parts = []
    if entry.get("answer_points"):
        waiting = sum(1 for a in entry.get("answers", []) if a.get("score") is None)
        parts.append(f"written answers {float(entry.get('answer_score') or 0):g} of {float(entry['answer_points']):g}"
                     + (f" ({waiting} to score by hand)" if waiting else ""))
    if percent := float((entry.get("late") or {}).get("percent", 0)):
        parts.append(f"{percent:g} % off for late work")
    if not parts:
        return ""
    return f"; {', '.join(parts)}: total {float(entry['total']):g} of {float(entry.get('points_possible', 0)):g}"


__all__ = ["CHECK_CALL", "ExerciseResult", "GradeOptions", "Handed", "exercises_in", "load_release", "grade_notebook",
           "submissions", "grade", "merge", "WouldReplace", "only_labs", "wanted_labs", "place", "rescore", "summary",
           "escape_summary"]
