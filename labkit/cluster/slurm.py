"""SLURM: batch jobs on a cluster's scheduler, and a real SLURM cluster on namespace hosts for tests.

On a department cluster, labkit talks to SLURM through its own commands, nothing else: :func:`submit` is ``sbatch``,
:func:`job` reads ``scontrol show job``, :func:`wait` polls it until the job ends, :func:`cancel` is ``scancel``.
:class:`labkit.cluster.MPICluster` with ``launcher="slurm"`` starts its MPI engines as one such job, and
:func:`labkit.cluster.run_mpi` with ``hosts="slurm"`` spreads its ranks over the nodes of the allocation it runs in.

:func:`slurm_cluster` makes a small real SLURM (Debian's ``slurm-wlm`` and ``munge``) for tests and benchmarks: a
``munged`` on a socket of its own, ``slurmctld`` on the first namespace host, a ``slurmd`` on every namespace host
(each one a node, under the host's name), with every file under a temporary folder, and removes all of it afterwards.
Commands that only talk to the controller (``sbatch``, ``squeue``, ``scontrol``, ``scancel``) run here with
``SLURM_CONF`` set; nothing of it listens outside the namespace hosts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LabkitError, ToolMissing
from . import hosts
from . import hosts as nshosts
from .hosts import namespace_pids
from .processes import kill_until_gone, process_tree

COMMANDS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun")
DAEMONS = ("slurmctld", "slurmd", "munged")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}
WHY = {"TIMEOUT": "it ran past its time limit and SLURM stopped it",
       "CANCELLED": "it was cancelled (scancel, or by an administrator)",
       "NODE_FAIL": "one of its nodes failed", "OUT_OF_MEMORY": "it ran out of the memory it asked for",
       "FAILED": "a command in it failed", "PREEMPTED": "a job of higher priority took its nodes",
       "BOOT_FAIL": "its nodes did not boot", "DEADLINE": "it could not end before its deadline"}


# Reasons a PENDING job gives that waiting will not cure (a limit of the partition or account, not busy nodes)
NEVER_STARTS = {"PartitionConfig": "it asks for more CPUs, nodes or memory than the partition has",
                "PartitionNodeLimit": "it asks for more nodes than the partition allows",
                "PartitionTimeLimit": "its time limit is over the partition's",
                "BadConstraints": "no node has the features it asks for",
                "InvalidAccount": "its account is not valid", "InvalidQOS": "its QOS is not valid"}


class SlurmError(LabkitError, RuntimeError):
    """A SLURM command failed or did not answer; the message says which, with SLURM's own words."""


class SlurmUnavailable(ToolMissing):
    """No SLURM here (its commands are missing), or a test cluster cannot be made; the message says which."""


@dataclass
class Job:
    """What ``scontrol show job`` says of one job."""

    id: int
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: str  # "0:0" (status:signal)
    nodes: str  # the node list ("labkit-host[0-1]"), or "(null)" before it runs
    time_limit: str
    reason: str
    output: str  # the path of its standard output file
    fields: dict = field(repr=False, default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def never_starts(self) -> bool:
        """PENDING for a reason that waiting does not cure (see NEVER_STARTS)."""
        return self.state == "PENDING" and self.reason in NEVER_STARTS

    def describe(self) -> str:
        if self.never_starts:
            return (f"SLURM job {self.id} will not start: it is PENDING for {self.reason}, {NEVER_STARTS[self.reason]} "
                    "(compare its options with `sinfo` and `scontrol show partition`)")
        if not self.ended:
            down = f"; {nodes_out()}" if any(w in self.reason for w in ("DOWN", "DRAIN")) else ""
            return f"SLURM job {self.id} is {self.state} (reason: {self.reason}, nodes {self.nodes}){down}"
        why = WHY.get(self.state, "")
        return (f"SLURM job {self.id} ended {self.state}" + (f": {why}" if why else "") +
                f" (exit code {self.exit_code}, time limit {self.time_limit}, nodes {self.nodes})")


def _env(env: dict | None) -> dict:
    return {**os.environ, **(env or {})}


def _command(argv: list[str], env: dict | None = None, timeout: float = 30) -> str:
    if shutil.which(argv[0], path=_env(env).get("PATH")) is None:
        raise SlurmUnavailable(f"{argv[0]} is not on PATH: run this on a SLURM cluster's login or compute node "
                               "(Debian/Ubuntu: apt install slurm-client)")
    conf = _env(env).get("SLURM_CONF")
    if conf and not os.path.exists(conf):  # SLURM's commands would retry for a minute
        raise SlurmUnavailable(f"SLURM_CONF names {conf}, which does not exist: fix or unset it")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=_env(env), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv)} did not answer within {timeout:g} s: is slurmctld running and reachable? "
                         "(scontrol ping)") from None
    if done.returncode != 0:
        raise SlurmError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def submit(script: str | None = None, options: list[str] = (), env: dict | None = None,
           wrap: str | None = None) -> int:
    """``sbatch`` a job script (its text) or a ``wrap`` command with ``options``; the job's id."""
    if (script is None) == (wrap is None):
        raise ValueError("give a job script or a wrap command, one of the two")
    argv = ["sbatch", "--parsable", *options]
    if wrap is not None:
        out = _command(argv + ["--wrap", wrap], env)
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as f:
            f.write(script)
        try:
            out = _command(argv + [f.name], env)
        finally:
            os.unlink(f.name)
    m = re.match(r"\s*(\d+)", out)
    if not m:
        raise SlurmError(f"sbatch printed no job id: {out!r}")
    return int(m.group(1))


def job(job_id: int, env: dict | None = None) -> Job:
    """What SLURM says of the job now. For a job array (one line per task): the first task not yet ended, else the
    first that did not complete, else the first."""
    out = _command(["scontrol", "show", "job", "-o", str(job_id)], env)
    tasks = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if "JobState=" in line]
    if not tasks:
        raise SlurmError(f"scontrol show job {job_id} said nothing of it: {out.strip()!r}")
    fields = next((t for t in tasks if t.get("JobState") not in ENDED), None) or next(
        (t for t in tasks if t.get("JobState") != "COMPLETED"), tasks[0])
    return Job(int(job_id), fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?"),
               fields.get("NodeList", "?"), fields.get("TimeLimit", "?"), fields.get("Reason", "?"),
               fields.get("StdOut", ""), fields)


def wait(job_id: int, timeout: float, env: dict | None = None, poll: float = 0.25, started: bool = False) -> Job:
    """Wait until the job ends (or, with ``started``, until it runs); its :class:`Job`. TimeoutError after
    ``timeout`` seconds, naming the state it is in (the job goes on: cancel it if it should not)."""
    deadline = time.monotonic() + timeout
    while True:
        now = job(job_id, env)
        if now.ended or (started and now.state == "RUNNING"):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"SLURM job {job_id} is still {now.state} after {timeout:g} s (reason: {now.reason})")
        time.sleep(poll)


def nodes_out(env: dict | None = None) -> str:
    """The nodes SLURM holds out of service (down, drained, failing) with its reason for each, as one line; where
    ``sinfo`` does not answer, the command to run instead."""
    try:
        out = _command(["sinfo", "-h", "-R", "-o", "%N %T: %E"], env, timeout=10)
    except (SlurmError, SlurmUnavailable):
        return "see `sinfo -R` for the nodes out of service"
    lines = [" ".join(line.split()) for line in out.splitlines() if line.strip()]
    return ("nodes out of service: " + "; ".join(lines)) if lines else "no node is out of service now"


def cancel(job_id: int, env: dict | None = None) -> None:
    _command(["scancel", str(job_id)], env)


def controller_address(env: dict | None = None) -> str:
    """The SLURM controller's address (or host name) from ``scontrol show config``."""
    out = _command(["scontrol", "show", "config"], env)
    m = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", out, re.M)
    if not m:
        raise SlurmError("scontrol show config names no SlurmctldHost")
    return m.group(2) or m.group(1)


# -- a real SLURM on namespace hosts, for tests --------------------------------------------------------


def available() -> tuple[bool, str]:
    ok, why = hosts.available()
    if not ok:
        return False, why
    missing = [c for c in DAEMONS + COMMANDS if shutil.which(c, path=os.environ.get("PATH", "") + ":/usr/sbin")
               is None]
    if missing:
        return False, f"a test SLURM cluster needs {', '.join(missing)} (apt install slurm-wlm munge)"
    return True, ""


CONF = """\
# A SLURM of namespace hosts, made by labkit.cluster.slurm.slurm_cluster for tests; removed with its folder.
ClusterName=labkit
SlurmctldHost={controller}({controller_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
ReturnToService=2
MailProg=/bin/true
KillWait=2
MessageTimeout=5
SlurmdTimeout=300
UnkillableStepTimeout=180
InactiveLimit=0
MinJobAge=600
{nodes}
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    hosts: object  # labkit.cluster.hosts.NamespaceHosts: the nodes, host 0 the controller too
    folder: Path
    conf: Path
    env: dict  # what SLURM's commands need here (SLURM_CONF), and what MPI jobs on these hosts need
    nodes: list[str]

    def submit(self, script: str | None = None, options: list[str] = (), wrap: str | None = None) -> int:
        return submit(script, options, self.env, wrap)

    def job(self, job_id: int) -> Job:
        return job(job_id, self.env)

    def wait(self, job_id: int, timeout: float, started: bool = False) -> Job:
        return wait(job_id, timeout, self.env, started=started)

    def cancel(self, job_id: int) -> None:
        cancel(job_id, self.env)

    def command(self, *argv: str, timeout: float = 30) -> str:
        return _command(list(argv), self.env, timeout)

    def jobs_processes(self, job_id: int | None = None) -> dict[str, list[str]]:
        """The processes on each node other than SLURM's and munge's own daemons: what jobs run, or left behind.
        With ``job_id``, only that job's: its slurmstepd ("slurmstepd: [ID.batch]", "[ID.0]", ...) and their
        descendants."""
        left = {}
        for name, ns in zip(self.nodes, self.hosts.namespaces):
            pids = namespace_pids(ns)
            if job_id is not None:
                steps = [p for p in pids if _cmdline(p).startswith(f"slurmstepd: [{job_id}.")]
                pids = steps + [d for step in steps for d in process_tree(step)]
            found = []
            for pid in pids:
                try:
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    continue
                if comm not in ("slurmctld", "slurmscriptd", "slurmd", "munged"):
                    found.append(f"{pid} {comm}")
            if found:
                left[name] = found
        return left


def _daemon(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


@contextmanager
def slurm_cluster(n_nodes: int = 2, cpus: int = 4, timeout: float = 60):
    """A real SLURM cluster of ``n_nodes`` namespace hosts with ``cpus`` CPUs each (declared: the machine's cores are
    shared), partition ``lab``; yields a :class:`SlurmCluster` once every node is idle, removes everything after."""
    ok, why = available()
    if not ok:
        raise SlurmUnavailable(why)
    folder = Path(tempfile.mkdtemp(prefix="labkit-slurm-"))
    daemons: list[tuple[str, subprocess.Popen]] = []  # (which, its process)
    try:
        with nshosts.namespace_hosts(n_nodes) as h:
            env = {"SLURM_CONF": str(folder / "slurm.conf"), "PATH": os.environ.get("PATH", "") + ":/usr/sbin"}
            conf, key = _write_config(folder, h, cpus)
            _start_daemons(h, folder, conf, key, {**os.environ, **env}, daemons)
            cluster = SlurmCluster(h, folder, conf, {**env, **nshosts.TCP_BETWEEN_HOSTS}, list(h.names))
            _until(lambda: _all_idle(cluster, daemons, n_nodes), timeout, f"the {n_nodes} nodes did not come up idle",
                   folder)
            yield cluster
    finally:
        _stop(daemons, folder)


def _write_config(folder: Path, h, cpus: int) -> tuple[Path, Path]:
    """slurm.conf (every namespace host a node, host 0 the controller), the state folder and a munge key: their paths."""
    nodes = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN"
                      for name, addr in zip(h.names, h.addresses))
    (folder / "state").mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(CONF.format(controller=h.names[0], controller_address=h.addresses[0], folder=folder, nodes=nodes))
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    return conf, key


def _start_daemons(h, folder: Path, conf: Path, key: Path, run: dict, daemons: list) -> None:
    """munged (waiting for its socket), then slurmctld on host 0 and a slurmd on every host, each added to ``daemons``
    as it starts."""
    def start(which: str, argv: list[str], log: str) -> None:
        daemons.append((which, _daemon(argv, run, folder / log)))

    start("munged", ["munged", "--foreground", "--force", f"--socket={folder}/munge.socket", f"--key-file={key}",
                     f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                     f"--seed-file={folder}/munge.seed"], "munged.out")
    _until(lambda: (folder / "munge.socket").exists(), 10, "munged did not open its socket", folder)
    start("slurmctld", h.daemon_argv(0, ["slurmctld", "-D", "-i", "-f", str(conf)]), "slurmctld.out")
    for i, name in enumerate(h.names):
        start(f"slurmd of {name}", h.daemon_argv(i, ["slurmd", "-D", "-N", name, "-f", str(conf)]),
              f"slurmd-{name}.out")


def _all_idle(cluster: SlurmCluster, daemons: list, n_nodes: int) -> bool:
    """Whether sinfo shows all ``n_nodes`` nodes idle; SlurmUnavailable, with the logs' tails, if a daemon exited."""
    for which, p in daemons:
        if p.poll() is not None:
            raise SlurmUnavailable(f"{which} exited ({p.returncode}):\n{_tails(cluster.folder)}")
    try:
        out = cluster.command("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
    except SlurmError:
        return False
    states = dict(line.split() for line in out.splitlines() if line.strip())
    return len(states) == n_nodes and all(s == "idle" for s in states.values())


def _stop(daemons: list, folder: Path) -> None:
    """Stop the daemons (the last started first), then whatever still runs from the folder, and remove the folder."""
    for _, p in reversed(daemons):
        if p.poll() is None:
            p.terminate()
    for _, p in reversed(daemons):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    kill_until_gone(lambda: _in_folder(folder), wait=5.0)
    shutil.rmtree(folder, ignore_errors=True)


def _in_folder(folder: Path) -> list[int]:
    """Processes whose command line names the cluster's folder (daemons, and slurmstepd's children, say)."""
    return [int(d.name) for d in Path("/proc").iterdir()
            if d.name.isdigit() and int(d.name) != os.getpid() and str(folder) in _cmdline(int(d.name))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _tails(folder: Path, lines: int = 8) -> str:
    out = []
    for log in sorted(folder.glob("*.log")) + sorted(folder.glob("*.out")):
        text = log.read_text(errors="replace").strip().splitlines()[-lines:]
        if text:
            out.append(f"--- {log.name}\n" + "\n".join(text))
    return "\n".join(out)


def _until(ready, timeout: float, what: str, folder: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"{what} within {timeout:g} s:\n{_tails(folder)}")
        time.sleep(0.2)
