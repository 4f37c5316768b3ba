"""A cluster of MPI engines: ipyparallel's controller and engines started with this environment's ``mpiexec`` (on
this machine, on several hosts, or as a SLURM job), stopped whatever happens to their owner; and ``first_ranks``
for code that runs on them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import LabkitError
from ..machine import usable_cores
from .launch import (
    JOB_MARK,
    LOCAL_ARGS,
    LOOPBACK_ONLY,
    SLURM_ARGS,
    address_toward,
    hosts_args,
    kill_marked,
    loopback_preload,
    mpi_env,
    mpiexec_path,
)
from .processes import process_alive, process_tree

# ipyparallel's SLURM engine launcher fills in {n}, {cluster_id}, {output_file} and {program_and_args} (ipengine)
SLURM_ENGINES = """#!/bin/sh
#SBATCH --job-name=labkit-engines-{{cluster_id}}
#SBATCH --ntasks={{n}}
#SBATCH --output={{output_file}}
{options}exec {mpiexec} {where} -n {{n}} {{program_and_args}}
"""

# The controller's heartbeat: an engine counts as started at the first beat after it registers, so ipyparallel's
# 3 s period cost 6 s per start of 4 engines here, 1.5 s at 0.5 s. The misses keep the tolerance of the defaults: the
# controller drops a silent engine after 30 s (10 x 3 s), an engine gives up a silent controller after 175 s
# (50 x 3.5 s: its checks run every period + 0.5 s).
HEARTBEAT_MS = 500
CONTROLLER_ARGS = [f"--HeartMonitor.period={HEARTBEAT_MS}", f"--HeartMonitor.max_heartmonitor_misses={30_000 // HEARTBEAT_MS}"]
ENGINE_ARGS = [f"--IPEngine.max_heartbeat_misses={175_000 // (HEARTBEAT_MS + 500)}"]


class ClusterError(LabkitError, RuntimeError):
    """The engines did not start, or do not form one MPI world."""


def _world_info():
    """Runs on an engine: its place in MPI_COMM_WORLD."""
    from mpi4py import MPI

    c = MPI.COMM_WORLD
    return c.Get_rank(), c.Get_size(), os.getpid()


class MPICluster:
    """An ipyparallel cluster of ``n`` MPI engines started with this environment's ``mpiexec``.

    Use it as a context manager (the engines are stopped on exit, and at interpreter exit in any case)::

        with MPICluster(4) as cluster:
            cluster.view.apply_sync(...)      # or %%px cells in a notebook

    Everything listens on 127.0.0.1. Engines get one BLAS thread each, ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1``
    when they outnumber the cores (``heavy_yield``, see :func:`mpi_env`), and ``LABKIT_MPI_TIMEOUT`` so a
    collective whose partner died raises ``TimeoutError`` instead of hanging the notebook.
    """

    def __init__(self, n: int = 4, start_timeout: float = 120, op_timeout: float = 120, blas_threads: int = 1,
                 activate: bool = True, heavy_yield: bool | None = None, hosts=None, launcher: str = "mpi",
                 slurm_options: list[str] = (), controller_ip: str | None = None):
        if n < 1:
            raise ValueError(f"n must be >= 1 engines, got {n}")
        if launcher not in ("mpi", "slurm"):
            raise ValueError(f"launcher must be 'mpi' (mpiexec from here) or 'slurm' (the engines as a SLURM job), "
                             f"got {launcher!r}")
        if launcher == "slurm" and hosts is not None:
            raise ValueError("launcher='slurm' takes its nodes from SLURM: leave hosts out, and ask for nodes with "
                             "slurm_options, e.g. ['--nodes=2', '--time=60']")
        bad = [o for o in slurm_options if not str(o).startswith("-") or any(c in str(o) for c in "{}\n")]
        if bad:
            raise ValueError(f"slurm_options are sbatch options such as '--time=60' or '--partition=gpu', got {bad}")
        self.launcher, self.slurm_options, self.controller_ip = launcher, [str(o) for o in slurm_options], controller_ip
        self._folder = None  # launcher="slurm": the engines' batch script
        self.n, self.start_timeout, self.op_timeout = n, start_timeout, op_timeout
        self.blas_threads, self.activate = blas_threads, activate
        self.heavy_yield = n > usable_cores() if heavy_yield is None else heavy_yield
        self.hosts = hosts  # None: every engine here, on 127.0.0.1; namespace hosts: the controller on their bridge
        self.cluster = None
        self.client = None
        self._view = None
        self._watchdog = None  # a detached process that stops the cluster if this one dies first
        self._job = os.urandom(8).hex()  # LABKIT_MPI_JOB of every engine, so that none outlives stop()

    def _config(self):
        from traitlets.config import Config

        env = {"LABKIT_MPI_TIMEOUT": str(self.op_timeout), "OMP_NUM_THREADS": str(self.blas_threads),
               "OPENBLAS_NUM_THREADS": str(self.blas_threads), "LABKIT_PROGRESS": "0", JOB_MARK: self._job}
        local = self.hosts is None and self.launcher == "mpi"
        env.update({k: v for k, v in mpi_env(self.n, self.heavy_yield, local=local).items()
                    if k.startswith("MPIR_") or (local and (k in LOOPBACK_ONLY or k == "LD_PRELOAD"))})
        cfg = Config()
        if self.launcher == "slurm":  # ipyparallel's SLURM launcher, its job running hydra's slurm launcher
            lines = "".join(f"#SBATCH {o}\n" for o in self.slurm_options)
            cfg.SlurmEngineSetLauncher.batch_template = SLURM_ENGINES.format(
                options=lines, mpiexec=str(mpiexec_path()), where=" ".join(SLURM_ARGS))
            cfg.SlurmEngineSetLauncher.batch_file_name = str(self._folder / "engines.sbatch")
            cfg.SlurmEngineSetLauncher.engine_cmd = [sys.executable, "-m", "ipyparallel.engine", "--mpi"]
            cfg.SlurmEngineSetLauncher.engine_args = ENGINE_ARGS
            # sbatch's refusal (on its stderr) into the error the notebook shows, and the id from its one line for it
            cfg.SlurmEngineSetLauncher.submit_command = ["sh", "-c", 'exec sbatch "$@" 2>&1', "sbatch"]
            cfg.SlurmEngineSetLauncher.job_id_regexp = r"Submitted batch job (\d+)"
            cfg.SlurmEngineSetLauncher.job_id_regexp_group = 1
            cfg.SlurmEngineSetLauncher.environment = env
            return cfg
        cfg.MPIEngineSetLauncher.mpi_cmd = [str(mpiexec_path())]
        cfg.MPIEngineSetLauncher.engine_args = ENGINE_ARGS
        if local:
            cfg.MPIEngineSetLauncher.mpi_args = LOCAL_ARGS
        else:
            args, extra = hosts_args(self.hosts, self.n)
            env.update(extra)
            if "LABKIT_BIND_ADDRESS" in extra and (preload := loopback_preload()) is not None:
                env["LD_PRELOAD"] = str(preload)
            cfg.MPIEngineSetLauncher.mpi_args = args
        cfg.MPIEngineSetLauncher.environment = env
        return cfg

    def _controller_ip(self) -> str:
        """Where the controller listens: ``controller_ip`` when given; 127.0.0.1 for engines on this machine; the bridge
        address of namespace hosts; for real hosts, this machine's address that the first host reaches it by, and for
        a SLURM job, the one the SLURM controller reaches it by (never 0.0.0.0)."""
        from .hosts import NamespaceHosts

        if self.controller_ip:
            return self.controller_ip
        if self.launcher == "slurm":
            from . import slurm

            return address_toward(slurm.controller_address())
        if self.hosts is None:
            return "127.0.0.1"
        if isinstance(self.hosts, NamespaceHosts):
            return self.hosts.bridge_address
        return address_toward(str(list(self.hosts)[0]))

    def start(self) -> MPICluster:
        """Start the controller and the engines, connect, and check that they form one MPI world; a detached watchdog
        stops them if this process dies without stopping them (a killed notebook kernel, an out-of-memory kill)."""
        import ipyparallel as ipp

        before = set(process_tree(os.getpid()))
        controller_ip = self._controller_ip()  # no SLURM here, say: raises before anything starts
        if self.launcher == "slurm":
            self._folder = Path(tempfile.mkdtemp(prefix="labkit-engines-"))
        self.cluster = ipp.Cluster(engines=self.launcher, n=self.n, controller_ip=controller_ip,
                                   config=self._config(), engine_timeout=self.start_timeout, shutdown_atexit=True,
                                   log_level=40, controller_args=CONTROLLER_ARGS)
        try:
            if self.launcher == "slurm":  # not ipyparallel's wait: it would not notice the job's end
                self.cluster.start_cluster_sync(n=self.n)
                self.client = self.cluster.connect_client_sync()
                self._wait_for_slurm_engines()
            else:
                self.client = self.cluster.start_and_connect_sync(activate=False)
                self.client.wait_for_engines(self.n, timeout=self.start_timeout)
        except Exception as e:
            job = self._slurm_state()
            self.stop()
            if isinstance(e, ClusterError):
                raise
            if isinstance(e, subprocess.CalledProcessError) and self.launcher == "slurm":
                said = (e.output.decode(errors="replace") if isinstance(e.output, bytes) else str(e.output or ""))
                raise ClusterError(f"SLURM did not take the engines' job: {said.strip() or e}. Check the "
                                   "slurm_options against `sinfo` (partitions, nodes, time limits)") from e
            raise ClusterError(f"{self.n} MPI engines did not start within {self.start_timeout:g} s: {e}. " +
                               (f"{job}. Check `squeue` and the job's output." if job else
                                "Run `labkit doctor` to check MPI.")) from e
        info = self.check_world()
        by_rank = {rank: pid for rank, _, pid in info}
        pids = dict(zip(self.client.ids, self.client[:].apply_sync(lambda: __import__("os").getpid())))
        self._view = self.client[[next(e for e, p in pids.items() if p == by_rank[r]) for r in range(self.n)]]
        self._view.block = True
        if self.activate and _in_ipython():
            self.view.activate()  # the %px / %%px magics
        started = {pid: ticks for pid, ticks in process_tree(os.getpid()).items() if pid not in before}
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "labkit.cluster.engines", "watch", str(os.getpid()), self.cluster.cluster_file,
             json.dumps(started), str(self._folder or "")], start_new_session=True, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # a session of its own: a group kill spares it
        return self

    @property
    def slurm_job(self) -> int | None:
        """The id of the engines' SLURM job (launcher="slurm", once submitted), else None."""
        if self.launcher != "slurm" or self.cluster is None:
            return None
        for engines in (self.cluster.engines or {}).values():
            if getattr(engines, "job_id", ""):
                return int(engines.job_id)
        return None

    def _slurm_job_info(self):
        from . import slurm

        job = self.slurm_job
        if job is None:
            return None
        try:
            return slurm.job(job)
        except (slurm.SlurmError, slurm.SlurmUnavailable):
            return None

    def _slurm_state(self) -> str:
        info = self._slurm_job_info()
        return "" if info is None else info.describe()

    def _wait_for_slurm_engines(self) -> None:
        """Wait for the n engines, but stop as soon as their SLURM job has ended or will never start."""
        deadline = time.monotonic() + self.start_timeout
        while len(self.client.ids) < self.n:
            if (info := self._slurm_job_info()) is not None:
                if info.never_starts:
                    raise ClusterError(f"the engines' {info.describe()}")
                if info.ended:
                    raise ClusterError(f"the engines' {info.describe()} before all {self.n} engines started; "
                                       f"its output: {info.output}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.client.ids)} of {self.n} engines registered")
            time.sleep(0.25)

    @property
    def view(self):
        """A DirectView on all engines, blocking, ordered by MPI rank."""
        if self._view is None:
            raise ClusterError("the cluster is not running: call start() or use `with MPICluster(n) as cluster:`")
        return self._view

    def px(self, code: str, timeout: float | None = None) -> list:
        """Run ``code`` on every engine, as a ``%%px`` cell does, but wait at most ``timeout`` seconds (default: the
        engines' own timeout for a collective plus 30 s): engines that do not answer by then (their host unreachable,
        or hanging) raise ClusterError naming their ranks and hosts, instead of a wait without end. An engine's own
        error raises as ipyparallel raises it."""
        import ipyparallel as ipp

        limit = self.op_timeout + 30 if timeout is None else timeout
        result = self.view.execute(code, block=False)
        deadline = time.monotonic() + limit
        try:
            while self.launcher == "slurm" and not result.ready():  # the engines' job may end first: say so at once
                if (info := self._slurm_job_info()) is not None and info.ended:
                    raise ClusterError(f"the engines' {info.describe()}; cluster.stop() ends what is left of it")
                result.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                if time.monotonic() > deadline:
                    break
            return result.get(timeout=max(0.0, deadline - time.monotonic()))
        except ipp.error.CompositeError as e:  # engines that died as their job ended: SLURM's word, not "died"
            if self.launcher == "slurm" and all(name == "EngineError" for name, *_ in e.elist):
                info = self._slurm_job_info()
                until = time.monotonic() + 30  # the controller may notice the engines gone before SLURM says why
                while info is not None and not info.ended and time.monotonic() < until:
                    time.sleep(0.5)
                    info = self._slurm_job_info()
                if info is not None and info.ended:
                    raise ClusterError(f"the engines' {info.describe()}; cluster.stop() ends what is left of "
                                       "it") from None
            raise
        except ipp.error.TimeoutError:
            pending = [rank for rank, mid in enumerate(result.msg_ids) if mid in self.client.outstanding]
            where = ""
            if self.hosts is not None:
                names = list(getattr(self.hosts, "names", self.hosts))
                where = " on " + ", ".join(sorted({str(names[r % len(names)]) for r in pending}))
            raise ClusterError(f"engine(s) of rank {', '.join(map(str, pending))}{where} did not answer within "
                               f"{limit:g} s: their host may be unreachable, or they hang. cluster.stop() ends them") \
                from None

    def check_world(self) -> list[tuple[int, int, int]]:
        """(rank, size, pid) of every engine; ClusterError unless ranks are 0..n-1 of one world of size n."""
        info = self.client[:].apply_sync(_world_info)
        ranks = sorted(r for r, _, _ in info)
        sizes = {s for _, s, _ in info}
        if ranks != list(range(self.n)) or sizes != {self.n}:
            raise ClusterError(f"the engines do not form one MPI world of {self.n}: (rank, size, pid) = {info}. "
                               "Were they started by different mpiexec calls?")
        return sorted(info)

    def stop(self) -> None:
        """Stop engines and controller (safe to call twice)."""
        self._view = None
        if self._watchdog is not None:
            self._watchdog.kill()  # stopped by its owner: nothing left to watch
            self._watchdog.wait()
            self._watchdog = None
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        job = self.slurm_job
        if self.cluster is not None:
            try:
                if self.launcher == "slurm" and job is None:  # SLURM took no job: nothing to scancel
                    self.cluster.engines.clear()
                # the engines first, while their controller still answers: ipyparallel's stop_cluster stops both at
                # once, and engines that lose their controller first took 3.5 s to end here, against 0.6 s
                self.cluster.stop_engines_sync()
                self.cluster.stop_controller_sync()
            except Exception:  # noqa: BLE001 - scancel of a job SLURM has forgotten, say: the controller goes anyway
                with contextlib.suppress(Exception):
                    self.cluster.stop_controller_sync()
            finally:
                self.cluster = None
                kill_marked(self._job)  # engines mpiexec could not reach to stop (a host cut off) end too
        if job is not None:  # scancel only asks: wait until SLURM has ended the engines on every node
            from . import slurm

            with contextlib.suppress(slurm.SlurmError, slurm.SlurmUnavailable, TimeoutError):
                slurm.wait(job, timeout=30)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> MPICluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- clusters whose owner died -----------------------------------------------------------------------


def watch(owner: int, cluster_file: str, processes: dict[int, int], folder: str = "", poll: float = 0.5) -> None:
    """Wait until process ``owner`` ends; then stop its cluster as ``ipcluster stop`` would (from the cluster file;
    for engines that are a SLURM job, that is scancel), kill what is left of ``processes`` (pid -> start time), first
    with SIGTERM, then SIGKILL, and remove ``folder`` (the engines' batch script)."""
    while process_alive(owner):
        time.sleep(poll)
    if Path(cluster_file).exists():
        try:
            import ipyparallel as ipp

            owned = ipp.Cluster.from_file(cluster_file)
            owned.stop_engines_sync()  # the engines first, as MPICluster.stop does
            owned.stop_controller_sync()
        except Exception:  # noqa: BLE001 - the processes are killed below in any case
            pass
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        left = [pid for pid, ticks in processes.items() if process_alive(pid, ticks)]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [pid for pid in left if process_alive(pid, processes[pid])]
    with contextlib.suppress(OSError):
        Path(cluster_file).unlink()
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def running_clusters() -> list:
    """The ipyparallel clusters whose files say they are running, in every IPython profile of this user."""
    from ipyparallel.cluster import ClusterManager

    return [c for c in ClusterManager().load_clusters().values() if c.controller is not None and c._is_running()]


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


@contextlib.contextmanager
def first_ranks(comm, k: int):
    """A communicator of the first ``k`` ranks of ``comm`` (``None`` on the others), freed afterwards.

    Every rank of ``comm`` must enter it (the split is collective)::

        with first_ranks(comm, 2) as sub:
            if sub:
                ...  # runs on ranks 0 and 1
    """
    from mpi4py import MPI

    if not 1 <= k <= comm.Get_size():
        raise ValueError(f"k must be between 1 and the {comm.Get_size()} ranks, got {k}")
    sub = comm.Split(0 if comm.Get_rank() < k else MPI.UNDEFINED, comm.Get_rank())
    try:
        yield sub if sub != MPI.COMM_NULL else None
    finally:
        if sub != MPI.COMM_NULL:
            sub.Free()


if __name__ == "__main__" and sys.argv[1:2] == ["watch"]:
    watch(int(sys.argv[2]), sys.argv[3], {int(k): v for k, v in json.loads(sys.argv[4]).items()},
          sys.argv[5] if len(sys.argv) > 5 else "")
