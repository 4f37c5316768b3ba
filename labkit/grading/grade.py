"""Grading a class: every student's notebooks, each run and judged by :mod:`.notebook`, into one set of grades.

    labkit grade submissions/ --out grades/

``submissions/`` holds one folder per student (``alice/05_cuda_kernels.ipynb``...) or the notebooks
themselves (the file name then names the student). Every notebook runs from top to bottom on the quick
profile; a cell that errs or runs past ``timeout`` seconds is stopped and the notebook goes on, so one
endless loop costs one exercise, never the rest of the notebook or the other students. An exercise is a
check cell, ``check.<name>(...)`` of an exercise declared in :mod:`labkit.check.exercises`: its verdict is the
check's, replayed by the grader on what the student's function returned (never the cell's own success).
Results go to ``grades.csv`` (one row per exercise) and ``grades.json`` (with scores), and the executed
notebooks beside them, for reading the students' errors in full. The answers to the labs' questions (predict and
explain, :mod:`.answers`) go to ``answers.html``, one table per question to read, and ``answers.csv``, whose
``score`` column the instructor fills in: the next run into the same folder keeps those scores.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from ..progress import progress_bar
from . import answers as answer_cells
from .assign import CHECK_CALL, RELEASE_FILE, exercises_in
from .notebook import ExerciseResult, grade_notebook, rows_of
from .sandbox import Limits


def load_release(release: Path | str | None) -> tuple[dict | None, str | None]:
    """The release record written by ``labkit assign --release DIR`` and its sha256: from ``release`` (the
    release.json or its folder), else ./release/release.json when it exists, else (None, None)."""
    import hashlib

    if release is None:
        default = Path("release") / RELEASE_FILE
        if not default.is_file():
            return None, None
        release = default
    path = Path(release)
    if path.is_dir():
        path = path / RELEASE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no release record at {path}: `labkit assign --release DIR` writes DIR/{RELEASE_FILE}")
    text = path.read_text(encoding="utf-8")
    try:
        record = json.loads(text)
        record["notebooks"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a release record written by labkit assign ({e})") from None
    return record, hashlib.sha256(text.encode()).hexdigest()


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


def released_name(path: Path, record: dict) -> str | None:
    """The released notebook a submission is: by file name, else (a flat folder named by students) the one most of
    whose check cells it holds, by id and by the check they call (ids alone repeat from notebook to notebook)."""
    import nbformat

    if path.name in record["notebooks"]:
        return path.name
    try:
        cells = {c.get("id"): c.get("source", "") for c in nbformat.read(path, as_version=4).cells}
    except Exception:  # noqa: BLE001 - an unreadable file is reported when it is run
        return None

    def holds(ex: dict) -> bool:
        source = cells.get(ex["check_cell_id"])
        return source is not None and f"check.{ex['name'].split('#')[0]}(" in source

    score = {name: sum(holds(ex) for ex in entry["exercises"]) for name, entry in record["notebooks"].items()}
    best = max(score, key=score.get, default=None)
    return best if best is not None and score[best] > 0 else None


def _grade_one(args) -> tuple[list[ExerciseResult], float, str]:
    """One submission (in a worker process with --jobs): its results, its seconds and the file's sha256."""
    import hashlib

    path, student, out_dir, timeout, profile, released, threads, isolate, limits, hidden_parts = args
    t0 = time.perf_counter()
    results = grade_notebook(path, student, out_dir, timeout, profile, released, threads, isolate, limits, hidden_parts)
    return results, time.perf_counter() - t0, hashlib.sha256(Path(path).read_bytes()).hexdigest()


def grade(folder: Path | str, out: Path | str = "grades", timeout: int = 60, profile: str = "quick",
          progress: bool | None = None, release: Path | str | None = None,
          jobs: int = 1, isolate: bool | None = None, limits: Limits | None = None,
          part: tuple[int, int] | None = None, resume: bool = False,
          hidden_parts: Iterable[str] = ()) -> tuple[list[ExerciseResult], Path, Path]:
    """Grade every notebook under ``folder``; write ``grades.csv`` and ``grades.json`` into ``out``.

    With a release record (``release``, or ./release/release.json), every exercise of every released notebook is
    graded for every student, by the check cells as handed out: a missing, edited or converted check cell fails and
    says so, and a notebook a student did not hand in fails all its exercises.

    ``jobs`` > 1 grades that many submissions at once (worker processes), each kernel's BLAS and OpenMP threads set
    to its share of the cores; the results are the same, in the same order.

    Each notebook runs in a sandbox of its own under ``limits`` (:mod:`labkit.grading.sandbox`) where one can be made
    here (``isolate=None``); where none can (or with ``isolate=False``) grading goes on after a warning that the
    submissions' code runs with the grader's rights.

    ``part=(k, n)`` grades only the k-th of n shares of the students (k = 0 .. n-1, every n-th student in name order):
    one share per task of a SLURM array, say, each into its own ``out``, put together by :func:`merge`.

    Each notebook's results are kept in ``out``/.progress as soon as it is graded. An interrupted run (Ctrl-C, or
    SIGTERM, which is taken as Ctrl-C) stops its workers and every sandbox, kernel and engine they started, writes no
    grades, and raises KeyboardInterrupt; ``resume=True`` then grades only what it had not finished (a notebook
    changed since is graded again), with the same options.

    ``hidden_parts`` names exercises (or ``"all"``) whose checks also run, silently, on a second secret draw of
    inputs: each such exercise gets a second row, ``<name>~hidden``, that counts like any other and whose message the
    feedback and the Gradescope export show only as "a hidden check failed"."""
    from .. import __version__
    from ..machine import usable_cores

    if timeout < 1:
        raise ValueError(f"timeout must be >= 1 second, got {timeout}")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    hidden_parts = _hidden_parts(hidden_parts)
    found = _share(submissions(Path(folder)), part)  # an empty or missing folder is said before anything starts
    isolate = _isolation(isolate)
    record, release_sha = load_release(release)
    if record is None:
        print("labkit grade: no release record (labkit assign --release DIR): exercises are the check cells found in "
              "each submission, so a deleted or edited check cell goes unnoticed", file=sys.stderr)
    out = Path(out)
    threads = max(1, usable_cores() // jobs) if jobs > 1 else None
    options = {"profile": profile, "timeout_s": timeout, "release_sha256": release_sha, "part": list(part) if part else None,
               "limits": asdict(limits or Limits()), "isolated": bool(isolate), "hidden_parts": sorted(hidden_parts)}
    kept = _Progress(out, options, resume)
    work = [(path, student, out / "executed" / student, timeout, profile,
             record["notebooks"][name] if record and (name := released_name(path, record)) else None, threads, isolate,
             limits, hidden_parts)
            for student, path in found]
    results: list[ExerciseResult] = []
    seconds, hashes = {}, {}
    with _sigterm_as_interrupt():
        graded = _grade_all(work, jobs, progress, kept)
    for (student, path), (mine, secs, digest) in zip(found, graded):
        results += mine
        seconds[(student, path.name)] = secs
        hashes[(student, path.name)] = digest
    if record:
        missing = _not_handed_in(found, record, hidden_parts)
        results += missing
        seconds.update({(r.student, r.notebook): 0.0 for r in missing})
    answered = _answers(found, record, out)
    meta = {"profile": profile, "timeout_s": timeout, "labkit_version": __version__, "isolated": bool(isolate),
            "limits": asdict(limits or Limits()),
            "graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "release_sha256": release_sha,
            "part": list(part) if part else None, "hidden_parts": sorted(hidden_parts)}
    students = _by_student(results, seconds, hashes)
    _add_answers(students, answered)
    csv_path, json_path = _write(out, results, {**meta, "students": students})
    kept.finish()
    return results, csv_path, json_path


PROGRESS = ".progress"


class _Progress:
    """The results of the notebooks graded so far in a run, one file each in ``out``/.progress, so that an
    interrupted run can be resumed; removed when the run has written its grades."""

    def __init__(self, out: Path, options: dict, resume: bool):
        import shutil

        self.folder = Path(out) / PROGRESS
        self.options = json.loads(json.dumps(options))
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
        import hashlib

        return self.folder / (hashlib.sha256(f"{student}\0{Path(path).name}".encode()).hexdigest()[:24] + ".json")

    def get(self, student: str, path: Path) -> tuple[list[ExerciseResult], float, str] | None:
        """The results kept for this notebook, if it is unchanged since it was graded."""
        import hashlib

        f = self._file(student, path)
        try:
            kept = json.loads(f.read_text())
            if kept["sha256"] != hashlib.sha256(Path(path).read_bytes()).hexdigest():
                return None
            return [ExerciseResult(**r) for r in kept["results"]], float(kept["seconds"]), kept["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, student: str, path: Path, item: tuple[list[ExerciseResult], float, str]) -> None:
        mine, secs, digest = item
        f = self._file(student, path)
        tmp = f.with_suffix(".part")
        tmp.write_text(json.dumps({"student": student, "notebook": Path(path).name, "sha256": digest, "seconds": secs,
                                   "results": [asdict(r) for r in mine]}))
        tmp.replace(f)

    def finish(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


class _sigterm_as_interrupt:
    """SIGTERM (a kill, a scheduler's time limit) handled as Ctrl-C: the run unwinds, stopping what it started."""

    def __enter__(self):
        import signal
        import threading

        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
        return False


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _answers(found: list[tuple[str, Path]], record: dict | None, out: Path) -> list[answer_cells.Answer]:
    """Every student's answers to the questions (blank ones too), with the scores an earlier run's answers.csv in
    ``out`` holds for answers unchanged since; written to answers.csv and answers.html."""
    import nbformat

    answered: list[answer_cells.Answer] = []
    prompts: dict[tuple[str, str], str] = {}
    for student, path in found:
        name = released_name(path, record) if record else path.name
        expected = (record["notebooks"][name].get("answers", []) if record and name in record["notebooks"] else None)
        try:
            nb = nbformat.read(path, as_version=4)
            mine = {a.question: a for a in answer_cells.collect(nb, student, name or path.name)}
            for i, cell in enumerate(nb.cells):
                if (m := answer_cells.meta(cell)) is not None:
                    prompts.setdefault((name or path.name, m["answer"]), answer_cells.question_text(nb, i))
        except Exception as e:  # noqa: BLE001 - an unreadable notebook has blank answers, said why
            mine, why = {}, f"the notebook could not be read ({type(e).__name__})"
        else:
            why = "its answer cell is missing from the notebook (deleted?)"
        for q in expected if expected is not None else []:
            answered.append(mine.pop(q["id"], None) or answer_cells.Answer(
                student, name, q["id"], q["kind"], int(q["points"]), "", True, note=why))
        answered += list(mine.values())
    if record:  # a released notebook a student did not hand in: its questions unanswered
        handed_in = {(s, released_name(p, record)) for s, p in found}
        for student in sorted({s for s, _ in found}):
            for name, entry in record["notebooks"].items():
                if (student, name) not in handed_in:
                    answered += [answer_cells.Answer(student, name, q["id"], q["kind"], int(q["points"]), "", True,
                                                     note="notebook not handed in") for q in entry.get("answers", [])]
        for name, entry in record["notebooks"].items():
            prompts.update({(name, q["id"]): q.get("question", "") for q in entry.get("answers", [])})
    for warning in answer_cells.merge_scores(answered, out / answer_cells.ANSWERS_CSV):
        print(f"labkit grade: answers.csv: {warning}", file=sys.stderr)
    if answered:
        answer_cells.write(out, answered, prompts)
    return answered


def _add_answers(students: dict, answered: list) -> None:
    """grades.json: per student and notebook, its answers and the points the instructor has scored so far."""
    for a in answered:
        entry = students.setdefault(a.student, {}).setdefault(a.notebook, {})
        entry.setdefault("answers", []).append(
            {"question": a.question, "kind": a.kind, "points": a.points, "blank": a.blank, "score": a.score})
    for notebooks in students.values():
        for entry in notebooks.values():
            if "answers" in entry:
                entry["answer_points"] = sum(q["points"] for q in entry["answers"])
                entry["answer_score"] = sum(q["score"] or 0 for q in entry["answers"])
                entry["answers_unscored"] = sum(q["score"] is None and not q["blank"] for q in entry["answers"])


def _isolation(isolate: bool | None) -> bool:
    """Whether the notebooks run in sandboxes: where one can be made (None), demanded (True) or not (False); says
    so on stderr when they are not."""
    from . import sandbox

    if isolate is None or isolate:
        ok, why = sandbox.available()
        if not ok and isolate:
            raise RuntimeError(f"labkit grade: cannot isolate the submissions: {why}")
        if not ok:
            print(f"labkit grade: WARNING: submissions are NOT isolated ({why}): their code runs with your rights and "
                  "can read and write what you can", file=sys.stderr)
        return ok
    print("labkit grade: WARNING: isolation turned off: the submissions' code runs with your rights", file=sys.stderr)
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
               kept: _Progress | None = None) -> list[tuple[list[ExerciseResult], float, str]]:
    """:func:`_grade_one` of every submission, in their order: here, or in ``jobs`` worker processes. What ``kept``
    holds of an interrupted run is not graded again; what is graded is kept as soon as it is."""
    from . import workers

    done: dict[int, tuple] = {}
    for k, args in enumerate(work):
        if kept is not None and (item := kept.get(args[1], args[0])) is not None:
            done[k] = item
    todo = [k for k in range(len(work)) if k not in done]
    with progress_bar(total=len(work), initial=len(done), enable=progress, desc="grading", unit="nb") as bar:
        def finished(k, item):
            done[k] = item
            if kept is not None:
                kept.put(work[k][1], work[k][0], item)
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


def _not_handed_in(found: list[tuple[str, Path]], record: dict, hidden_parts=frozenset()) -> list[ExerciseResult]:
    """A failed row for every exercise (and hidden part) of every released notebook a student did not hand in."""
    handed_in = {(s, released_name(p, record)) for s, p in found}
    return [ExerciseResult(student, name, row, False, "notebook not handed in")
            for student in sorted({s for s, _ in found}) for name, entry in record["notebooks"].items()
            if (student, name) not in handed_in for ex in entry["exercises"] for row in rows_of(ex["name"], hidden_parts)]


def _hidden_parts(names: Iterable[str]) -> frozenset[str]:
    """The exercises to grade with a hidden part: declared exercises, or "all"; a name labkit does not know is refused."""
    from ..check.exercises import EXERCISES

    wanted = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(n for n in wanted if n != "all" and n not in EXERCISES)
    if unknown:
        raise ValueError(f"--hidden-part: {', '.join(unknown)} is no exercise labkit knows (they are the names of the "
                         "check calls, check.<name>(...), e.g. ring_allreduce), or give all")
    return wanted


def _by_student(results: list[ExerciseResult], seconds: dict, hashes: dict) -> dict:
    """grades.json's students: per student and notebook, the score, the seconds, the file's sha256 and the rows."""
    summary: dict = {}
    for (student, nb_name), secs in seconds.items():
        mine = [r for r in results if r.student == student and r.notebook == nb_name]
        summary.setdefault(student, {})[nb_name] = {
            "passed": sum(r.passed for r in mine), "exercises": len(mine), "seconds": round(secs, 1),
            "results": [asdict(r) for r in mine]}
    for (student, nb_name), digest in hashes.items():
        summary[student][nb_name]["sha256"] = digest
    return summary


def _write(out: Path, results: list[ExerciseResult], data: dict) -> tuple[Path, Path]:
    """grades.csv and grades.json, each written whole or not at all (a temporary file renamed into place)."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "grades.csv", out / "grades.json"
    with open(csv_path.with_suffix(".csv.part"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "exercise", "passed", "message"])
        for r in results:
            w.writerow([r.student, r.notebook, r.exercise, int(r.passed), r.message])
    csv_path.with_suffix(".csv.part").replace(csv_path)
    json_path.with_suffix(".json.part").write_text(json.dumps(data, indent=2) + "\n")
    json_path.with_suffix(".json.part").replace(json_path)
    return csv_path, json_path


def merge(parts: list[Path | str], out: Path | str) -> tuple[list[ExerciseResult], Path, Path]:
    """Put the grades of several ``labkit grade --part`` runs (their output folders, or grades.json files) into one
    grades.csv and grades.json in ``out``. The parts must come from the same release and labkit version, and no
    student may be graded in two of them."""
    loaded = []
    for p in parts:
        path = Path(p) / "grades.json" if Path(p).is_dir() else Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"no grades.json at {path}: give the --out folders of the labkit grade runs")
        try:
            data = json.loads(path.read_text())
            data["students"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a grades.json written by labkit grade ({e})") from None
        loaded.append((path, data))
    if not loaded:
        raise ValueError("nothing to merge: give the output folders of the labkit grade runs")
    for key in ("release_sha256", "labkit_version", "profile", "timeout_s", "hidden_parts"):
        values = {json.dumps(d.get(key)) for _, d in loaded}
        if len(values) > 1:
            raise ValueError(f"the parts differ in {key} ({', '.join(sorted(values))}): grade every part with the "
                             "same release, labkit version and options")
    students: dict = {}
    owner: dict = {}
    for path, data in loaded:
        for student, notebooks in data["students"].items():
            if student in students:
                raise ValueError(f"{student} was graded in two parts: {owner[student]} and {path}")
            students[student], owner[student] = notebooks, path
    results = [ExerciseResult(**r) for student in sorted(students) for nb in students[student].values()
               for r in nb.get("results", [])]
    first = loaded[0][1]
    meta = {k: first.get(k) for k in ("profile", "timeout_s", "labkit_version", "release_sha256", "isolated", "limits",
                                      "hidden_parts")}
    meta["isolated"] = all(d.get("isolated") for _, d in loaded)
    meta["graded_at"] = max(str(d.get("graded_at", "")) for _, d in loaded)
    meta["parts"] = [{"grades": str(p), "part": d.get("part"), "graded_at": d.get("graded_at")} for p, d in loaded]
    csv_path, json_path = _write(Path(out), results, {**meta, "students": {s: students[s] for s in sorted(students)}})
    return results, csv_path, json_path


def summary(results: list[ExerciseResult]) -> str:
    """One line per student and notebook, then each failed exercise with its message."""
    lines, by = [], {}
    for r in results:
        by.setdefault((r.student, r.notebook), []).append(r)
    for (student, nb_name), rs in by.items():
        lines.append(f"{student:>16}  {nb_name}: {sum(r.passed for r in rs)}/{len(rs)} exercises passed")
        lines += [f"{'':>18}x {r.exercise}: {r.message}" for r in rs if not r.passed]
    return "\n".join(lines)


__all__ = ["CHECK_CALL", "ExerciseResult", "exercises_in", "load_release", "grade_notebook", "submissions", "grade",
           "merge", "summary"]
