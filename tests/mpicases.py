"""The named cases of the MPI test programs (tests/mpi/cases_*.py) as pytest tests: one test per case and rank count,
each reported on its own, as mpi4py's own suite runs each of its tests at any ``mpiexec -n``.

A family's test file says which program it runs at which rank counts::

    test_collectives_match_mpi = mpi_cases("cases_collectives.py", ranks(1, 2, 3, 4, 5, 6))

Collecting lists the program's cases (one Python process runs every program as far as its ``run_cases()``, on one
rank); a case registered ``with on_ranks(3):`` is a test only at 3 ranks or more. Running them starts one MPI job
per program and rank count, with the cases of that job that this session selected (``-k``, ``--lf`` and the like
choose cases), on the first of them to run: a failed case does not stop the cases after it. A case that never
ended (a deadlock, or a rank that died) fails naming the job's end and its stderr, and the cases it kept from
running say so.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MPI_DIR = Path(__file__).resolve().parent / "mpi"
_RESULTS: dict[tuple[str, int], dict[str, str | None]] = {}  # (program, ranks) -> case -> its failure, or None


@functools.cache
def listing() -> dict[str, list[dict] | str]:
    """Every case program's cases ({name, least, most}, in order), by file name; a program that cannot be listed (it
    needs CuPy, say) gives the error instead."""
    code = (f"import json, sys; sys.path.insert(0, {str(MPI_DIR)!r}); import _cases; "
            "print('LISTING ' + json.dumps(_cases.list_cases(sys.argv[1:])))")
    files = [str(p) for p in sorted(MPI_DIR.glob("cases_*.py"))]
    res = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, timeout=120,
                         cwd=MPI_DIR)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("LISTING ")), None)
    if line is None:
        raise RuntimeError(f"listing the MPI test cases failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(line[len("LISTING "):])


def mpi_cases(program: str, counts, timeout: float = 300, marks=()):
    """A test of each case of tests/mpi/<program> at each rank count of ``counts`` (ints, or conftest.ranks()'s
    params, whose marks each case at that count carries) on which the case runs, under a real mpiexec."""
    cases = listing().get(program)
    if cases is None or isinstance(cases, str):
        raise RuntimeError(f"tests/mpi/{program} lists no cases: {cases or 'no such program'}")
    params = []
    for count in counts:
        n, count_marks = (count.values[0], tuple(count.marks)) if hasattr(count, "values") else (count, ())
        params += [pytest.param(n, c["name"], id=f"{n}-{c['name']}", marks=count_marks) for c in cases
                   if c["least"] <= n and (c["most"] is None or n <= c["most"])]

    @pytest.mark.mpi
    @pytest.mark.parametrize(("n", "case"), params)
    def test(n, case, request):
        run_mpi_case(request, program, n, case, timeout)

    for mark in marks:
        test = mark(test)
    test.__doc__ = f"A case of tests/mpi/{program}, under mpiexec at n ranks."
    return test


def run_mpi_case(request, program: str, n: int, case: str, timeout: float) -> None:
    """Pass or fail as the case did in its job (started here for every case of it this session selected)."""
    key = (program, n)
    if key not in _RESULTS:
        siblings = [it.callspec.params["case"] for it in request.session.items
                    if getattr(it, "function", None) is request.function and it.callspec.params["n"] == n]
        _RESULTS[key] = run_job(program, n, siblings, timeout)
    failure = _RESULTS[key].get(case, f"{case!r} did not run in the job of tests/mpi/{program} on {n} ranks")
    if failure:
        pytest.fail(failure, pytrace=False)


def run_job(program: str, n: int, cases: list[str], timeout: float) -> dict[str, str | None]:
    """Run ``cases`` of tests/mpi/<program> on n ranks in one MPI job: each case's failure (None: passed)."""
    from labkit import cluster

    with tempfile.TemporaryDirectory(prefix="labkit-mpicases-") as folder:
        only, report = Path(folder) / "only.json", Path(folder) / "report.jsonl"
        only.write_text(json.dumps(cases))
        args = [str(MPI_DIR / program), "--only", str(only), "--report", str(report)]
        try:
            res = cluster.run_mpi(args, n=n, timeout=timeout)
            ended, stderr, code = f"ended (exit {res.returncode})", res.stderr, res.returncode
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
            ended, stderr, code = f"passed its {timeout:.0f} s limit and was ended", err, None
        lines = [json.loads(ln) for ln in report.read_text().splitlines()] if report.exists() else []
    job = f"the job of tests/mpi/{program} on {n} ranks"
    results: dict[str, str | None] = {}
    for line in lines:
        if "case" in line:
            out = f"\n--- rank 0 printed ---\n{line['printed']}" if line["printed"].strip() else ""
            results[line["case"]] = None if not line["failed_on"] else (
                f"case {line['case']!r} failed on rank{'s' if len(line['failed_on']) > 1 else ''} "
                f"{', '.join(map(str, line['failed_on']))}:\n{line['error']}{out}")
    started = [ln["start"] for ln in lines if "start" in ln]
    tail = f"\n--- stderr ---\n{stderr[-3000:]}" if stderr.strip() else ""
    if started and started[-1] not in results:  # the case the job ended in
        results[started[-1]] = f"{job} {ended} in this case{tail}"
    for case in cases:
        if case not in results:
            where = f"in case {started[-1]!r}" if started else "before its first case"
            results[case] = f"not run: {job} {ended} {where}{tail}"
    if code and all(results[c] is None for c in cases):  # every case passed, but the job did not end well
        results[cases[-1]] = f"{job} {ended} after its last case{tail}"
    return results
