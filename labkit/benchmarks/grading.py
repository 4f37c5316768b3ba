"""How fast a class is graded: ``labkit grade`` on one core against ``--jobs`` equal to the core count.

Run: ``labkit bench grading [--quick] [--json]``

The submissions are copies of lab 01 as the instructor wrote it (every exercise passes), graded on the quick profile
(with ``--quick``, two copies of lab 01 up to its last exercise's check: a test of the benchmark, not a measurement).
Keys: ``grading_notebooks_per_minute_jobs1``, ``grading_notebooks_per_minute_jobsN`` (N = the usable cores) and
their ratio ``grading_parallel_speedup``, each notebook in its sandbox, both warm (the grader imported: by this
process for one job, by the workers' fork server for N); ``grading_command_seconds`` and ``grading_command_speedup``
(not with ``--quick``): ``labkit grade`` run once each way as a command, a fresh process that imports the grader and
starts its workers; ``grading_cores_busy_jobs1``, the cores one job
already keeps busy (CPU seconds of the kernels over wall seconds, measured without the sandbox, whose kernels are not
this process's children): the most a job per core can gain is the core count divided by it; and, where a sandbox can
be made,
``grading_sandbox_overhead_s``: the seconds the sandbox adds per notebook (one job with it against one job without);
and (not with ``--quick``) ``grading_seconds_per_lab``, every lab with exercises graded once as the instructor wrote
it, with ``grading_max_seconds_per_notebook``; ``feedback_seconds_per_notebook``, the seconds ``--feedback`` takes to
write one student's page (the median of three writes of the whole class's pages, over the notebooks) and
``exports_seconds``, the Gradescope and Canvas exports of the class.
The configurations alternate over the rounds.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import runner
from ..bench import interleaved, machine_info
from ..grading import exports, feedback, sandbox, workers
from ..machine import usable_cores

TARGETS = {"grading_parallel_speedup": (">=", 1.7), "grading_sandbox_overhead_s": ("<=", 2.0),
           "grading_max_seconds_per_notebook": ("<=", 60.0), "feedback_seconds_per_notebook": ("<=", 1.0)}


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Grade the same submissions with 1 job and with one job per core, in alternating rounds."""
    rounds = (1 if quick else 2) if rounds is None else rounds
    cores = usable_cores()
    n = 2 if quick else 2 * max(cores, 2)
    lab = runner.find_notebooks(only="01_")[0]
    timings, passed, busy, isolated, handing_on = _grade_in_rounds(lab, n, cores, rounds, quick)
    per_minute = {jobs: 60 * n / t.median for jobs, t in timings.items()}
    result = {"quick": quick, "rounds": rounds, "notebooks": n, "lab": lab.name, "cores": cores,
              "machine": machine_info(), "passed": {str(k): list(v) for k, v in passed.items()},
              "grading_notebooks_per_minute_jobs1": per_minute[1],
              "grading_notebooks_per_minute_jobsN": per_minute[cores],
              "grading_parallel_speedup": per_minute[cores] / per_minute[1],
              "isolated": isolated, "seconds": {str(k): t.times for k, t in timings.items()}, **handing_on}
    result["targets_met"] = {"grading_parallel_speedup": result["grading_parallel_speedup"] >= 1.7,
                             "feedback_seconds_per_notebook": result["feedback_seconds_per_notebook"] <= 1.0}
    if not quick:
        result.update(_every_lab_once())
    # what --jobs 1 already keeps busy (BLAS threads in the lab's cells): the most --jobs N can gain is cores / this
    result["grading_cores_busy_jobs1"] = sorted(busy)[len(busy) // 2] if busy else None
    if isolated:
        result["grading_sandbox_overhead_s"] = (timings[1].median - timings["plain"].median) / n
        result["targets_met"]["grading_sandbox_overhead_s"] = result["grading_sandbox_overhead_s"] <= 2.0
    if "grading_max_seconds_per_notebook" in result:
        result["targets_met"]["grading_max_seconds_per_notebook"] = result["grading_max_seconds_per_notebook"] <= 60
    return result


def _grade_in_rounds(lab: Path, n: int, cores: int, rounds: int, quick: bool):
    """``n`` copies of ``lab`` graded with 1 job and with ``cores`` jobs (in the sandbox where one can be made) and with
    1 job without it, alternating over the rounds: the timings, what passed, the cores busy, whether isolated, and
    what follows (the feedback, the exports and, not with ``quick``, the command run once each way)."""
    with tempfile.TemporaryDirectory(prefix="labkit-bench-grading-") as tmp:
        subs = Path(tmp) / "subs"
        for i in range(n):
            (subs / f"student{i:02d}").mkdir(parents=True)
            _copy(lab, subs / f"student{i:02d}" / lab.name, quick)
        passed: dict = {}
        isolated = sandbox.available()[0]
        busy: list = []

        def job(jobs: int, isolate: bool):
            return _grading_job(subs, Path(tmp) / f"out{jobs}{isolate}", jobs, isolate, passed, busy)

        # both sides warm, as in a grading run: this process has imported the grader for --jobs 1, and the workers'
        # fork server (started once a process, as the command line starts it beside its own imports) for --jobs N
        workers.start()
        configs = {1: job(1, isolated), cores: job(cores, isolated), "plain": job(1, False)}
        timings = interleaved(configs, rounds)
        command = _command_once(subs, Path(tmp), cores) if not quick else {}
        return timings, passed, busy, isolated, {**_handing_on(Path(tmp) / f"out1{isolated}", n), **command}


def _copy(lab: Path, dest: Path, quick: bool) -> None:
    """A student's copy of ``lab``; with ``quick``, only its cells up to the last exercise's check, every exercise
    kept (lab 01's timed epochs after them are most of its run)."""
    if not quick:
        shutil.copy(lab, dest)
        return
    import nbformat

    from ..grading import assign

    nb = nbformat.read(lab, as_version=4)
    last = max(i for i, _ in assign.exercises_in(nb))
    nb.cells = nb.cells[:last + 1]
    nbformat.write(nb, dest)


def _command_once(subs: Path, tmp: Path, cores: int) -> dict:
    """The command itself, each run a fresh process that imports everything and starts its own workers: the seconds
    of ``labkit grade`` with ``--jobs 1`` and with ``--jobs`` per core, once each, and their ratio."""
    seconds = {}
    for jobs in (1, cores):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "labkit", "grade", str(subs), "--out", str(tmp / f"command{jobs}"),
                               "--jobs", str(jobs), "--timeout", "120"], capture_output=True, text=True,
                              env={**os.environ, "LABKIT_PROGRESS": "0"})
        seconds[jobs] = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"labkit grade --jobs {jobs} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return {"grading_command_seconds": {str(k): v for k, v in seconds.items()},
            "grading_command_speedup": seconds[1] / seconds[cores]}


def _handing_on(out: Path, n: int) -> dict:
    """The seconds of what follows a graded class of ``n`` notebooks in ``out``: the feedback pages (per notebook,
    the median of three writes) and the two gradebook exports."""

    data = exports.load(out)
    times = []
    for k in range(3):
        t0 = time.perf_counter()
        pages = feedback.write(data, out / f"feedback{k}", out)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    exports.gradescope(data, out)
    exports.canvas(data, out)
    return {"feedback_seconds_per_notebook": statistics.median(times) / max(len(pages), 1),
            "feedback_pages": len(pages), "exports_seconds": time.perf_counter() - t0}


def _grading_job(subs: Path, out: Path, jobs: int, isolate: bool, passed: dict, busy: list):
    """A job: grade ``subs`` into ``out`` and return the seconds, noting what passed, and (1 job without the sandbox)
    the cores busy in ``busy``."""
    from ..grading import grade

    def timed() -> float:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        results, _, _ = grade.grade(subs, out, timeout=120, progress=False, jobs=jobs, isolate=isolate)
        passed[f"{jobs}{'' if isolate else ' unisolated'}"] = sum(r.passed for r in results), len(results)
        seconds = time.perf_counter() - t0
        if jobs == 1 and not isolate:  # the kernels are this process's children (in a sandbox, bwrap's)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            busy.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / seconds)
        return seconds
    return timed


def _every_lab_once() -> dict:
    """Every lab with exercises, as the instructor wrote it, graded once in its sandbox at --jobs 1: the seconds of
    each, the most of them, and how many exercises passed."""
    import nbformat

    from ..grading import assign, grade

    labs = [p for p in runner.find_notebooks() if assign.has_exercises(nbformat.read(p, as_version=4))]
    with tempfile.TemporaryDirectory(prefix="labkit-bench-grading-") as tmp:
        (Path(tmp) / "subs" / "teacher").mkdir(parents=True)
        for p in labs:
            shutil.copy(p, Path(tmp) / "subs" / "teacher" / p.name)
        results, _, json_path = grade.grade(Path(tmp) / "subs", Path(tmp) / "out", timeout=120, progress=False)
        per_lab = {nb: v["seconds"] for nb, v in json.loads(json_path.read_text())["students"]["teacher"].items()}
    return {"grading_seconds_per_lab": per_lab, "grading_max_seconds_per_notebook": max(per_lab.values()),
            "passed_every_lab": [sum(r.passed for r in results), len(results)]}


def report(result: dict) -> str:
    """A few lines for people."""
    return "\n".join([
        f"grading benchmark: {result['notebooks']} copies of {result['lab']} (quick profile), {result['cores']} cores, "
        f"median of {result['rounds']} round(s)",
        f"  --jobs 1: {result['grading_notebooks_per_minute_jobs1']:.1f} notebooks per minute",
        f"  --jobs {result['cores']}: {result['grading_notebooks_per_minute_jobsN']:.1f} notebooks per minute",
        f"  --jobs 1 keeps {result['grading_cores_busy_jobs1']:.2f} cores busy (without the sandbox): --jobs "
        f"{result['cores']} can gain at most {result['cores'] / result['grading_cores_busy_jobs1']:.2f}x",
        f"grading_parallel_speedup: {result['grading_parallel_speedup']:.2f} (target >= 1.7: "
        f"{'met' if result['targets_met']['grading_parallel_speedup'] else 'NOT met'})"
        + (f"; the command, started afresh each way: {result['grading_command_speedup']:.2f}"
           if "grading_command_speedup" in result else ""),
        f"feedback_seconds_per_notebook: {result['feedback_seconds_per_notebook']:.2f} s (target <= 1: "
        f"{'met' if result['targets_met']['feedback_seconds_per_notebook'] else 'NOT met'}); the Gradescope and "
        f"Canvas exports of the class: {result['exports_seconds']:.2f} s"]
        + ([f"grading_sandbox_overhead_s: {result['grading_sandbox_overhead_s']:.2f} s per notebook (target <= 2: "
            f"{'met' if result['targets_met']['grading_sandbox_overhead_s'] else 'NOT met'})"]
           if "grading_sandbox_overhead_s" in result else
           ["sandbox: none could be made here, so the notebooks ran without isolation"])
        + ([f"every lab graded once: at most {result['grading_max_seconds_per_notebook']:.1f} s a notebook (target <= 60: "
            f"{'met' if result['targets_met']['grading_max_seconds_per_notebook'] else 'NOT met'}); "
            + ", ".join(f"{k.split('_')[0]} {v:.0f} s" for k, v in result["grading_seconds_per_lab"].items())]
           if "grading_seconds_per_lab" in result else []))
