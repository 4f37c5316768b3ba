"""How fast a class is graded: ``labkit grade`` on one core against ``--jobs`` equal to the core count.

Run: ``labkit bench grading [--quick] [--json]``

The submissions are copies of lab 01 as the instructor wrote it (every exercise passes), graded on the quick profile.
Keys: ``grading_notebooks_per_minute_jobs1``, ``grading_notebooks_per_minute_jobsN`` (N = the usable cores) and
their ratio ``grading_parallel_speedup``, each notebook in its sandbox; ``grading_cores_busy_jobs1``, the cores one job
already keeps busy (CPU seconds of the kernels over wall seconds, measured without the sandbox, whose kernels are not
this process's children): the most a job per core can gain is the core count divided by it; and, where a sandbox can
be made,
``grading_sandbox_overhead_s``: the seconds the sandbox adds per notebook (one job with it against one job without).
The configurations alternate over the rounds.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

from ..bench import interleaved, machine_info
from ..machine import usable_cores

TARGETS = {"grading_parallel_speedup": (">=", 1.7), "grading_sandbox_overhead_s": ("<=", 2.0)}


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Grade the same submissions with 1 job and with one job per core, in alternating rounds."""
    from .. import grade, report, sandbox

    rounds = (1 if quick else 2) if rounds is None else rounds
    cores = usable_cores()
    n = 2 if quick else 2 * max(cores, 2)
    lab = report.find_notebooks(only="01_")[0]
    with tempfile.TemporaryDirectory(prefix="labkit-bench-grading-") as tmp:
        subs = Path(tmp) / "subs"
        for i in range(n):
            (subs / f"student{i:02d}").mkdir(parents=True)
            shutil.copy(lab, subs / f"student{i:02d}" / lab.name)
        passed = {}

        isolated = sandbox.available()[0]

        busy = []

        def job(jobs: int, isolate: bool):
            def timed() -> float:
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                results, _, _ = grade.grade(subs, Path(tmp) / f"out{jobs}{isolate}", timeout=120, progress=False,
                                            jobs=jobs, isolate=isolate)
                passed[f"{jobs}{'' if isolate else ' unisolated'}"] = sum(r.passed for r in results), len(results)
                seconds = time.perf_counter() - t0
                if jobs == 1 and not isolate:  # the kernels are this process's children (in a sandbox, bwrap's)
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    busy.append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / seconds)
                return seconds
            return timed

        configs = {1: job(1, isolated), cores: job(cores, isolated), "plain": job(1, False)}
        timings = interleaved(configs, rounds)
    per_minute = {jobs: 60 * n / t.median for jobs, t in timings.items()}
    result = {"quick": quick, "rounds": rounds, "notebooks": n, "lab": lab.name, "cores": cores,
              "machine": machine_info(), "passed": {str(k): list(v) for k, v in passed.items()},
              "grading_notebooks_per_minute_jobs1": per_minute[1],
              "grading_notebooks_per_minute_jobsN": per_minute[cores],
              "grading_parallel_speedup": per_minute[cores] / per_minute[1],
              "isolated": isolated, "seconds": {str(k): t.times for k, t in timings.items()}}
    result["targets_met"] = {"grading_parallel_speedup": result["grading_parallel_speedup"] >= 1.7}
    # what --jobs 1 already keeps busy (BLAS threads in the lab's cells): the most --jobs N can gain is cores / this
    result["grading_cores_busy_jobs1"] = sorted(busy)[len(busy) // 2] if busy else None
    if isolated:
        result["grading_sandbox_overhead_s"] = (timings[1].median - timings["plain"].median) / n
        result["targets_met"]["grading_sandbox_overhead_s"] = result["grading_sandbox_overhead_s"] <= 2.0
    return result


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
        f"{'met' if result['targets_met']['grading_parallel_speedup'] else 'NOT met'})"]
        + ([f"grading_sandbox_overhead_s: {result['grading_sandbox_overhead_s']:.2f} s per notebook (target <= 2: "
            f"{'met' if result['targets_met']['grading_sandbox_overhead_s'] else 'NOT met'})"]
           if "grading_sandbox_overhead_s" in result else
           ["sandbox: none could be made here, so the notebooks ran without isolation"]))
