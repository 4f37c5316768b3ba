"""Grading students' notebooks: run each one with a time limit per cell and score every check cell.

    labkit grade submissions/ --out grades/

``submissions/`` holds one folder per student (``alice/05_cuda_kernels.ipynb``...) or the notebooks
themselves (the file name then names the student). Every notebook runs from top to bottom on the quick
profile; a cell that errs or runs past ``timeout`` seconds is stopped and the notebook goes on, so one
endless loop costs one exercise, never the rest of the notebook or the other students. An exercise is a
code cell that calls ``check.<name>(...)``: it passes when that cell finishes without an error.
Results go to ``grades.csv`` (one row per exercise) and ``grades.json`` (with scores), and the executed
notebooks beside them, for reading the students' errors in full.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .assign import CHECK_CALL, RELEASE_FILE, exercises_in
from .progress import progress_bar
from .report import ANSI_ESCAPES, inject_parameters
from .sandbox import Limits


@dataclass
class ExerciseResult:
    student: str
    notebook: str
    exercise: str
    passed: bool
    message: str


def _outcome(cell, timeout: int) -> tuple[bool, str]:
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return False, "not run (the notebook stopped before this cell)"
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            if out.get("ename") == "KeyboardInterrupt":
                return False, f"stopped after the {timeout} s limit per cell (an endless loop, or far too slow?)"
            if out.get("ename") in ENGINE_ERRORS:  # a %%px cell: the engines' own errors were printed above
                found = _engine_error(cell)
                if found:
                    return False, found
            first = ANSI_ESCAPES.sub("", str(out.get("evalue", ""))).strip().splitlines()
            return False, f"{out.get('ename')}: {first[0] if first else ''}".strip()
    return True, "passed"


ENGINE_ERRORS = ("AlreadyDisplayedError", "CompositeError", "RemoteError")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.*)$")


def _engine_error(cell) -> str | None:
    """The exception line that the MPI engines printed for a ``%%px`` cell that says most (rank 0's ExerciseError)."""
    lines = []
    for out in cell.get("outputs", []):
        text = out.get("text", "") if out.get("output_type") == "stream" else ""
        lines += ANSI_ESCAPES.sub("", text).splitlines()
    found = [m for m in map(_EXCEPTION_LINE.match, (ln.strip() for ln in lines)) if m]
    if not found:
        return None
    # an ExerciseError first, and of those rank 0's (the other ranks say only that rank 0 shows what went wrong)
    best = min(found, key=lambda m: (not m.group(1).endswith("ExerciseError"), "rank 0 shows" in m.group(2)))
    return f"{best.group(1).rsplit('.', 1)[-1]}: {best.group(2)} (on the MPI engines)"


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


def _released_checks(nb, released: dict) -> tuple[list[tuple[int, str]], dict[str, str]]:
    """The released exercises found in a submission by their check cells' ids, each check cell put back as it was
    handed out; and, per exercise, what was wrong with its cell (missing, turned into markdown, edited)."""
    by_id = {c.get("id"): i for i, c in enumerate(nb.cells)}
    found, problems = [], {}
    for ex in released["exercises"]:
        i = by_id.get(ex["check_cell_id"])
        if i is None:
            problems[ex["name"]] = "its check cell is missing from the notebook (deleted?)"
            continue
        cell = nb.cells[i]
        if cell.cell_type != "code":
            problems[ex["name"]] = f"its check cell was turned into a {cell.cell_type} cell"
            continue
        if cell.source != ex["check_source"]:
            problems[ex["name"]] = "its check cell was edited (the cell as handed out was run instead)"
            cell.source = ex["check_source"]
        found.append((i, ex["name"]))
    return found, problems


def _replay(check_name: str, folder: Path, seed: int, timeout: int) -> tuple[bool, str]:
    """The check's verdict on the record, in the grader's processes: here, or for MPI ranks under mpiexec."""
    from . import capture, replay
    from .cluster import run_mpi

    files = capture.records(folder, check_name)
    if len(files) <= 1 and check_name not in MPI_CHECKS:
        return replay.replay(check_name, folder, seed)
    if capture.recorded_reference(folder, check_name):
        return replay.replay(check_name, folder, seed)  # says which reference, without starting ranks
    try:
        done = run_mpi(["-m", "labkit.replay", check_name, str(folder), str(seed), "--mpi"], n=max(1, len(files)),
                       timeout=max(60, 2 * timeout))
    except subprocess.TimeoutExpired:
        return False, f"{check_name}: replaying the record on {len(files)} ranks ran past {max(60, 2 * timeout)} s"
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            verdict = json.loads(line)
            return bool(verdict["passed"]), str(verdict["message"])
        except (ValueError, KeyError, TypeError):
            continue
    return False, f"{check_name}: replaying the record failed: {(done.stderr or done.stdout).strip()[-300:]}"


MPI_CHECKS = ("ring_allreduce", "data_parallel_step", "async_worker")


def _earlier_error(nb, index: int) -> str | None:
    """The first error of a code cell above ``index``: why a name the check needs was never defined."""
    for j, cell in enumerate(nb.cells[:index]):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error" and out.get("ename") != "KeyboardInterrupt":
                first = ANSI_ESCAPES.sub("", str(out.get("evalue", ""))).strip().splitlines()
                return f"an earlier cell (cell {j}) failed: {out.get('ename')}: {first[0] if first else ''}".strip()
    return None


def _verdict(cell, check_name: str, folder: Path, seed: int, timeout: int, stopped: str | None,
             earlier: str | None = None) -> tuple[bool, str]:
    """One exercise: stopped or not run as the notebook says; otherwise what the check says on the record."""
    from . import capture

    ran, message = _outcome(cell, timeout)
    if stopped and not ran and message.startswith("not run"):
        return False, stopped
    if not ran and (message.startswith("not run") or message.startswith("stopped after")):
        return False, message
    if not capture.records(folder, check_name):
        if not ran:
            return False, message + (f"; {earlier}" if earlier and "NameError" in message else "")
        return False, ("the check cell ran but recorded nothing of your function (was labkit's check replaced or "
                       "its call changed?)")
    passed, message = _replay(check_name, folder, seed, timeout)
    return passed, "passed" if passed else message


def grade_notebook(path: Path, student: str, out_dir: Path, timeout: int = 60, profile: str = "quick",
                   released: dict | None = None, threads: int | None = None, isolate: bool | None = None,
                   limits: Limits | None = None) -> list[ExerciseResult]:
    """Execute one student's notebook into ``out_dir`` and return one result per exercise (never raises for the
    student's errors).

    The notebook runs in a sandbox of its own (:mod:`labkit.sandbox`; ``isolate=None`` where one can be made) and in
    record mode (:mod:`labkit.capture`) on inputs drawn afresh: right after each check cell, what it recorded of the
    student's functions is moved out of the notebook's reach, and the check is replayed on it in the grader's own
    processes, which give the verdict. A cell over ``timeout`` is interrupted; one that does not stop within
    :data:`GRACE` more seconds has its kernel killed with everything it started."""
    import secrets
    import shutil
    import tempfile
    import threading

    import nbformat
    from nbclient import NotebookClient

    from . import capture, sandbox

    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, {"PROFILE": profile})
    exercises, problems = _released_checks(nb, released) if released else (exercises_in(nb), {})
    by_cell: dict[int, list[str]] = {}
    for i, name in exercises:
        by_cell.setdefault(i, []).append(name)
    seed = secrets.randbelow(1_000_000) + 1
    isolate = sandbox.available()[0] if isolate is None else isolate
    limits = limits or Limits()
    private = Path(tempfile.mkdtemp(prefix="labkit-grader-"))  # the grader's alone: records, kernel spec
    work = Path(tempfile.mkdtemp(prefix="labkit-sandbox-"))  # the notebook's scratch folder
    inbox = work / ".labkit-capture"
    state: dict = {"cell": None, "t0": 0.0, "killed": None}
    cgroups = sandbox.make_cgroup(limits) if isolate else []

    def start(cell, cell_index, **kw):
        if cell_index in by_cell:  # what earlier cells recorded never counts
            shutil.rmtree(inbox, ignore_errors=True)
            inbox.mkdir()
        state["cell"], state["t0"] = cell_index, time.monotonic()

    def executed(cell, cell_index, **kw):
        state["cell"] = None
        for name in by_cell.get(cell_index, []):
            target = private / "records" / name
            target.mkdir(parents=True, exist_ok=True)
            check_name = name.split("#")[0]
            for f in list(inbox.glob(f"{check_name}.r*.json")) + list(inbox.glob(f"{check_name}.r*.npz")):
                if f.is_file() and not f.is_symlink() and f.stat().st_size <= RECORD_LIMIT:
                    shutil.copyfile(f, target / f.name)
        shutil.rmtree(inbox, ignore_errors=True)

    env = {**os.environ, "MPLBACKEND": "agg", "LABKIT_PROGRESS": "0", capture.ENV: str(inbox),
           capture.SEED_ENV: str(seed)}
    if threads:  # several notebooks at once: each kernel's BLAS and OpenMP get their share of the cores
        env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    options = dict(timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
                   extra_arguments=["--IPKernelApp.log_level=ERROR"], on_cell_start=start, on_cell_executed=executed)
    if isolate:
        client = NotebookClient(nb, km=_sandboxed_kernel(work, private, limits, cgroups, sandbox.environment(work, env)),
                                resources={"metadata": {"path": str(work)}}, **options)
    else:
        client = NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}, **options)

    def kill() -> None:
        sandbox.kill_cgroup(cgroups)
        proc = getattr(getattr(client.km, "provisioner", None), "process", None) if client.km else None
        if proc is not None and proc.poll() is None:
            try:
                pgid = os.getpgid(proc.pid)
                os.killpg(pgid, signal.SIGKILL) if pgid != os.getpgid(0) else proc.kill()
            except OSError:
                pass

    finished = threading.Event()

    def watchdog() -> None:  # from outside the kernel: a cell that ignores the interrupt is killed with its kernel
        while not finished.wait(0.25):
            cell = state["cell"]
            if cell is not None and time.monotonic() - state["t0"] > timeout + GRACE:
                state["killed"] = cell
                kill()
                return

    guard = threading.Thread(target=watchdog, daemon=True, name="labkit-grade-watchdog")
    guard.start()
    stopped = None
    try:
        try:
            client.execute(env=env)
        except Exception as e:  # the kernel died (a crash in compiled code, memory, the watchdog): cells not reached fail
            stopped = f"the notebook's kernel stopped: {type(e).__name__}: {ANSI_ESCAPES.sub('', str(e)).strip()[:300]}"
        finally:
            finished.set()
            guard.join()
        if state["killed"] is not None:
            stopped = (f"not run: cell {state['killed']} ran past the {timeout} s limit and did not stop when "
                       "interrupted, so the kernel and everything it started were killed")
        elif cgroups and sandbox.oom_killed(cgroups):
            stopped = f"the notebook went over its memory limit ({limits.memory_mb} MB) and its kernel was killed"
        forks = bool(cgroups) and sandbox.hit_process_limit(cgroups)
        out_dir.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out_dir / path.name)
        outcomes = {}
        for i, name in exercises:
            if i == state["killed"]:
                outcomes[name] = (False, f"stopped after the {timeout} s limit per cell; it ignored the interrupt, so "
                                         "the kernel and everything it started (engines, MPI ranks) were killed")
                continue
            passed, message = _verdict(nb.cells[i], name.split("#")[0], private / "records" / name, seed, timeout,
                                       stopped, _earlier_error(nb, i))
            if forks and not passed:
                message += f" (the notebook hit its limit of {limits.processes} processes and threads)"
            outcomes[name] = (passed, message)
    finally:
        finished.set()
        sandbox.remove_cgroup(cgroups)
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    names = [ex["name"] for ex in released["exercises"]] if released else [name for _, name in exercises]
    results = []
    for name in names:  # every released exercise gets a row, in the release's order
        passed, message = outcomes.get(name, (False, ""))
        if name in problems:
            passed, message = False, problems[name] + (f"; when run: {message}" if name in outcomes else "")
        results.append(ExerciseResult(student, path.name, name, passed, message))
    return results


GRACE = 10  # seconds a cell has, after the interrupt, to stop before its kernel is killed
RECORD_LIMIT = 256 << 20  # bytes: a larger record file is not read (the checks' records are a few MB at most)


def _sandboxed_kernel(work: Path, private: Path, limits, cgroups, env: dict):
    """A kernel manager whose kernel starts in the sandbox, talking over Unix sockets in the scratch folder (the
    sandbox has no network of its own beyond its loopback)."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    from . import sandbox

    ipc = work / ".ipc"
    ipc.mkdir()
    spec_dir = private / "kernels" / "labkit-sandbox"
    spec_dir.mkdir(parents=True)
    argv = sandbox.command([sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], work, limits,
                           cgroups, env, log=private / "kernel.log")
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "labkit sandbox",
                                                      "language": "python", "interrupt_mode": "message"}))
    ksm = KernelSpecManager(kernel_dirs=[str(private / "kernels")], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="labkit-sandbox", kernel_spec_manager=ksm, transport="ipc", ip=str(ipc / "k"),
                         connection_file=str(ipc / "kernel.json"))


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


def _match(path: Path, record: dict) -> str | None:
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

    path, student, out_dir, timeout, profile, released, threads, isolate, limits = args
    t0 = time.perf_counter()
    results = grade_notebook(path, student, out_dir, timeout, profile, released, threads, isolate, limits)
    return results, time.perf_counter() - t0, hashlib.sha256(Path(path).read_bytes()).hexdigest()


def grade(folder: Path | str, out: Path | str = "grades", timeout: int = 60, profile: str = "quick",
          progress: bool | None = None, release: Path | str | None = None,
          jobs: int = 1, isolate: bool | None = None, limits: Limits | None = None,
          part: tuple[int, int] | None = None) -> tuple[list[ExerciseResult], Path, Path]:
    """Grade every notebook under ``folder``; write ``grades.csv`` and ``grades.json`` into ``out``.

    With a release record (``release``, or ./release/release.json), every exercise of every released notebook is
    graded for every student, by the check cells as handed out: a missing, edited or converted check cell fails and
    says so, and a notebook a student did not hand in fails all its exercises.

    ``jobs`` > 1 grades that many submissions at once (worker processes), each kernel's BLAS and OpenMP threads set
    to its share of the cores; the results are the same, in the same order.

    Each notebook runs in a sandbox of its own under ``limits`` (:mod:`labkit.sandbox`) where one can be made here
    (``isolate=None``); where none can (or with ``isolate=False``) grading goes on after a warning that the
    submissions' code runs with the grader's rights.

    ``part=(k, n)`` grades only the k-th of n shares of the students (k = 0 .. n-1, every n-th student in name order):
    one share per task of a SLURM array, say, each into its own ``out``, put together by :func:`merge`."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from . import __version__
    from .machine import usable_cores

    if timeout < 1:
        raise ValueError(f"timeout must be >= 1 second, got {timeout}")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    from . import sandbox

    if isolate is None or isolate:
        ok, why = sandbox.available()
        if not ok and isolate:
            raise RuntimeError(f"labkit grade: cannot isolate the submissions: {why}")
        isolate = ok
        if not ok:
            print(f"labkit grade: WARNING: submissions are NOT isolated ({why}): their code runs with your rights and "
                  "can read and write what you can", file=sys.stderr)
    else:
        print("labkit grade: WARNING: isolation turned off: the submissions' code runs with your rights",
              file=sys.stderr)
    record, release_sha = load_release(release)
    if record is None:
        print("labkit grade: no release record (labkit assign --release DIR): exercises are the check cells found in "
              "each submission, so a deleted or edited check cell goes unnoticed", file=sys.stderr)
    out = Path(out)
    results: list[ExerciseResult] = []
    seconds, hashes = {}, {}
    found = submissions(Path(folder))
    if part is not None:
        k, n_parts = part
        if not (isinstance(k, int) and isinstance(n_parts, int) and 0 <= k < n_parts):
            raise ValueError(f"part must be (k, n) with 0 <= k < n, got {part!r}")
        names = sorted({s for s, _ in found})
        mine = set(names[k::n_parts])
        found = [(s, p) for s, p in found if s in mine]
    threads = max(1, usable_cores() // jobs) if jobs > 1 else None
    work = [(path, student, out / "executed" / student, timeout, profile,
             record["notebooks"][name] if record and (name := _match(path, record)) else None, threads, isolate,
             limits)
            for student, path in found]
    done = []
    with progress_bar(total=len(work), enable=progress, desc="grading", unit="nb") as bar:
        if jobs == 1:
            for args in work:
                done.append(_grade_one(args))
                bar.update(1)
        else:  # worker processes (spawned: no copy of this process's threads or state); map keeps the order
            with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
                for item in pool.map(_grade_one, work):
                    done.append(item)
                    bar.update(1)
    for (student, path), (mine, secs, digest) in zip(found, done):
        results += mine
        seconds[(student, path.name)] = secs
        hashes[(student, path.name)] = digest
    if record:
        handed_in = {(s, _match(p, record)) for s, p in found}
        for student in sorted({s for s, _ in found}):
            for name, entry in record["notebooks"].items():
                if (student, name) not in handed_in:
                    results += [ExerciseResult(student, name, ex["name"], False, "notebook not handed in")
                                for ex in entry["exercises"]]
                    seconds[(student, name)] = 0.0
    summary: dict = {}
    for (student, nb_name), secs in seconds.items():
        mine = [r for r in results if r.student == student and r.notebook == nb_name]
        summary.setdefault(student, {})[nb_name] = {
            "passed": sum(r.passed for r in mine), "exercises": len(mine), "seconds": round(secs, 1),
            "results": [asdict(r) for r in mine]}
    for (student, nb_name), digest in hashes.items():
        summary[student][nb_name]["sha256"] = digest
    meta = {"profile": profile, "timeout_s": timeout, "labkit_version": __version__, "isolated": bool(isolate),
            "limits": asdict(limits or Limits()),
            "graded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "release_sha256": release_sha,
            "part": list(part) if part else None}
    csv_path, json_path = _write(out, results, {**meta, "students": summary})
    return results, csv_path, json_path


def _write(out: Path, results: list[ExerciseResult], data: dict) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out / "grades.csv", out / "grades.json"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "exercise", "passed", "message"])
        for r in results:
            w.writerow([r.student, r.notebook, r.exercise, int(r.passed), r.message])
    json_path.write_text(json.dumps(data, indent=2) + "\n")
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
    for key in ("release_sha256", "labkit_version", "profile", "timeout_s"):
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
    meta = {k: first.get(k) for k in ("profile", "timeout_s", "labkit_version", "release_sha256", "isolated", "limits")}
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
