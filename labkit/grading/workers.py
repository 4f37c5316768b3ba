"""The worker processes of ``labkit grade --jobs N``: where they come from, how they start, how they are stopped.

Workers are forked from multiprocessing's fork server, which imports the grader (:data:`MODULES`) once: a worker
then starts in milliseconds, where a freshly spawned interpreter first spends about a second importing the grader
(nbformat, nbclient, jupyter_client, jsonschema). The fork server starts with the first pool, or earlier with
:func:`start` (the command line calls it before importing the grader itself, so that both imports run at once), and
lasts as long as the process that started it. Workers are never forks of the grading process itself, whose threads (a
progress bar's, a notebook kernel's when the grader runs inside Jupyter) a fork would copy in whatever state they are.

This module imports nothing heavy, so that the command line can start the fork server before it imports the grader.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver

MODULES = ["labkit.grading.grade"]


def context():
    """The multiprocessing context of the workers: the fork server that preloads :data:`MODULES`; a fresh
    interpreter each (spawn) where there is no fork server (not POSIX)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(MODULES)
    return forkserver


def start() -> None:
    """Start the fork server now (it imports the grader while this process goes on); nothing where there is none."""
    if context().get_start_method() == "forkserver":
        forkserver.ensure_running()


def pool(jobs: int):
    """A pool of ``jobs`` workers, each started with this process's environment and folder as they are now (the fork
    server keeps those of its own start)."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context(), initializer=_started,
                               initargs=(dict(os.environ), os.getcwd()))


def _started(environ: dict, cwd: str) -> None:
    """In each worker: the parent's environment and folder; Ctrl-C is the parent's to handle; SIGTERM (sent by the
    parent when the run is interrupted) unwinds the notebook being graded, whose sandbox, kernel and engines are then
    stopped and removed."""
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def stop(pool) -> None:
    """Stop an interrupted run's workers and what they started: SIGTERM (each cleans up its notebook), then SIGKILL
    for any still there after 30 s."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join(5)
