"""The grader's side of :mod:`labkit.check.capture`: a check replayed on a record, in a process of the grader's.

``python -m labkit.grading.replay CHECK FOLDER SEED [--mpi]`` prints the verdict as JSON (under ``mpiexec`` for the checks
that run on every MPI rank, each rank replaying its own record), with the check's cases passed and counted
(``"cases": [3, 7]``, null for a check that counts none), which partial credit reads, and what an open exercise's
passing answer scored (``"score": {"label": ..., "value": 12.5, "unit": "µs", "lower_is_better": true}``, null for a
check that scores nothing and for a failed answer), which the class's leaderboard ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from .. import __version__
from ..check import capture
from ..check.capture import NotRecorded, Replay, recorded_reference
from ..check.common import ExerciseError, last_cases, last_score
from ..check.exercises import exercise


def replay(check: str, folder: Path | str, seed_: int, comm=None) -> tuple[bool, str]:
    """Run ``check`` on its record (this rank's, from ``folder``) in this process; (passed, message) on rank 0.

    The student's function is the record: each call answers with what the student's function returned there for the
    same inputs. The comparisons, and so the verdict, are the check's own, made here."""
    return counted(check, folder, seed_, comm)[:2]


def counted(check: str, folder: Path | str, seed_: int, comm=None) -> tuple[bool, str, tuple[int, int] | None]:
    """:func:`replay`, with the check's (cases passed, cases) of this replay: None where the check counts no cases,
    or never ran its cases (no record, labkit's reference handed in)."""
    return verdict(check, folder, seed_, comm)[:3]


def verdict(check: str, folder: Path | str, seed_: int,
            comm=None) -> tuple[bool, str, tuple[int, int] | None, dict | None]:
    """:func:`counted`, with what a passing answer scored (:func:`labkit.check.common.scored`, as JSON): None where
    the check scores nothing, and for an answer that failed, which is never ranked."""
    declared = exercise(check)
    if declared is None:
        return False, f"{check}: no such check in labkit {_version()}", None, None
    fn = declared.check()
    rank = comm.Get_rank() if comm is not None else 0
    reference = recorded_reference(folder, check)
    if reference:
        return False, f"{check}: uses labkit's reference ({reference}): the exercise is to write it yourself", None, None
    try:
        session = Replay(check, Path(folder), rank, seed_)
    except NotRecorded as e:
        return False, str(e), None, None
    arg = session.record.get("source")  # a C or CUDA C exercise: the check reads the source, the record runs it
    out = io.StringIO()
    capture.begin(session)
    try:
        with contextlib.redirect_stdout(out):
            if comm is not None:
                fn(arg if arg is not None else capture.replayed(session, "fn", check), comm=comm)
            else:
                fn(arg if arg is not None else capture.replayed(session, "fn", check))
    except ExerciseError as e:
        return False, f"{type(e).__name__}: {e}", last_cases(), None
    except NotRecorded as e:
        return False, f"{type(e).__name__}: {e}", None, None
    except Exception as e:  # noqa: BLE001 - the check itself failed on this record: say so, never crash the grader
        return False, f"the check could not run on the record: {type(e).__name__}: {e}", None, None
    finally:
        capture.end()
    score = last_score()
    return True, out.getvalue().strip() or "passed", last_cases(), score.to_json() if score else None


def _version() -> str:
    return __version__


def main(argv=None) -> int:
    """``python -m labkit.grading.replay CHECK FOLDER SEED [--mpi]``: replay one check and print its verdict as JSON."""
    ap = argparse.ArgumentParser(prog="python -m labkit.grading.replay")
    ap.add_argument("check")
    ap.add_argument("folder")
    ap.add_argument("seed", type=int)
    ap.add_argument("--mpi", action="store_true", help="one rank of an mpiexec run, replaying that rank's record")
    a = ap.parse_args(argv)
    comm = None
    if a.mpi:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    passed, message, cases, score = verdict(a.check, a.folder, a.seed, comm)
    if comm is None or comm.Get_rank() == 0:
        print(json.dumps({"passed": passed, "message": message, "cases": cases, "score": score}))
    return 0


if __name__ == "__main__":  # run as labkit.grading.replay, not as a second copy of this module called __main__
    from labkit.grading.replay import main as _main

    sys.exit(_main())
