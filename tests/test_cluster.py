"""MPI launching under a real mpiexec (the wheel's), with several rank counts."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from labkit import cluster
from labkit.cluster import processes

pytestmark = pytest.mark.mpi

ALLREDUCE = """
from mpi4py import MPI
import numpy as np
c = MPI.COMM_WORLD
x = np.arange(5, dtype=np.float64) * (c.rank + 1)
y = np.empty_like(x)
c.Allreduce(x, y)
want = np.arange(5) * c.size * (c.size + 1) / 2
assert np.array_equal(y, want), (y, want)
ranks = c.gather(c.rank)  # one printer: output of several ranks may interleave mid-line
if c.rank == 0:
    print(f"ranks {sorted(ranks)} of {c.size} ok", flush=True)
"""


def test_mpiexec_is_the_environments():
    import sys
    from pathlib import Path

    assert cluster.mpiexec_path().parent in (Path(sys.prefix) / "bin", Path(sys.executable).parent)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_allreduce_job(n, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    res = cluster.run_mpi([str(script)], n=n, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"ranks {list(range(n))} of {n} ok" in res.stdout


def test_one_rank_raising_aborts_the_job(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("from mpi4py import MPI\nimport time\n"
                      "if MPI.COMM_WORLD.rank == 1:\n    raise RuntimeError('rank 1 gives up')\n"
                      "MPI.COMM_WORLD.Barrier()\n")
    t0 = time.monotonic()
    res = cluster.run_mpi([str(script)], n=3, timeout=60)
    assert res.returncode != 0
    assert "rank 1 gives up" in res.stderr
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_timeout_kills_every_rank(tmp_path):
    script = tmp_path / "sleep.py"
    marker = f"labkit-sleep-{tmp_path.name}"
    script.write_text(f"import time\n# {marker}\ntime.sleep(300)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        cluster.run_mpi([str(script)], n=2, timeout=5)
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"


def test_heavy_yield_when_oversubscribed():
    import os

    assert cluster.mpi_env((os.cpu_count() or 1) + 1)["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"
    assert "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in cluster.mpi_env(1)
    assert cluster.mpi_env(1, heavy_yield=True)["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"


@pytest.mark.slow
def test_mpi_engines_form_one_world_and_stop():
    import numpy as np

    code = (
        "import numpy as np\n"
        "from mpi4py import MPI\n"
        "from labkit import settings\n"
        "from labkit.collectives import ring_allreduce\n"
        "c = MPI.COMM_WORLD\n"
        "result = (c.Get_rank(), ring_allreduce(c, np.arange(4.0) * (c.Get_rank() + 1)), settings.mpi_timeout())\n"
    )

    with cluster.MPICluster(3, op_timeout=30) as cl:
        info = cl.check_world()
        assert [r for r, _, _ in info] == [0, 1, 2] and {s for _, s, _ in info} == {3}
        cl.view.execute(code)
        results = cl.view.pull("result")
        assert [r for r, _, _ in results] == [0, 1, 2]  # the view is ordered by MPI rank
        for _, value, timeout in results:
            np.testing.assert_array_equal(value, np.arange(4.0) * 6)
            assert timeout == 30.0
        pids = [pid for _, _, pid in info]
    time.sleep(0.5)
    alive = [pid for pid in pids if subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0]
    assert not alive, f"engines still running after stop: {alive}"
    with pytest.raises(cluster.ClusterError, match="not running"):
        _ = cl.view
    with pytest.raises(ValueError, match="n must be >= 1"):
        cluster.MPICluster(0)


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    found, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _listening(pids: set[int]) -> list[str]:
    """Local addresses of the TCP/UDP sockets that these processes listen on (``ss``)."""
    out = subprocess.run(["ss", "-ltnupH"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[4] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host == "::1"


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to list listening sockets")
@pytest.mark.skipif(cluster.loopback_preload() is None,
                    reason="no C compiler (cc) to build the library that keeps hydra's port on loopback")
@pytest.mark.slow
def test_mpi_jobs_and_engines_listen_on_loopback_only(tmp_path):
    """On one machine nothing labkit starts can be reached from the network: hydra's control port and the MPI network
    modules on loopback, engines and controller on 127.0.0.1 (with hydra's defaults this fails: 0.0.0.0 and eth0)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os, subprocess\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\nc.Barrier()\n"
                     "pids = c.gather(os.getpid())\n"
                     "if c.Get_rank() == 0:\n"
                     "    print('SS', subprocess.run(['ss', '-ltnupH'], capture_output=True, text=True).stdout)\n"
                     "    print('PIDS', pids, os.getppid())\n"
                     "c.Barrier()\n")
    res = cluster.run_mpi([str(probe)], n=2, timeout=60)
    assert res.returncode == 0, res.stderr
    pids = {int(p) for p in res.stdout.split("PIDS", 1)[1].replace("[", " ").replace("]", " ").replace(",", " ").split()}
    table = res.stdout.split("SS", 1)[1].split("PIDS", 1)[0]
    mine = [line.split()[4] for line in table.splitlines() if any(f"pid={p}," in line for p in pids)]
    assert mine and all(_loopback(a) for a in mine), mine  # the ranks and their launcher
    # the engines and their controller, started from a process of their own: what the earlier tests of a whole run
    # leave in this one cannot count (in two full runs something listened beyond loopback here that no subset of the
    # suite reproduced: _owners names it, should it appear in the fresh process too)
    script = tmp_path / "engines.py"
    script.write_text("import json, os, sys\nsys.path.insert(0, sys.argv[1])\n"
                      "from test_cluster import _descendants, _listening\nfrom labkit import cluster\n"
                      "with cluster.MPICluster(2, start_timeout=60) as cl:\n"
                      "    cl.view.execute('x = 1')\n"  # the engines have connected and work
                      "    print('ADDRESSES', json.dumps(_listening(_descendants(os.getpid()) | {os.getpid()})))\n")
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, str(script), here], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    addresses = json.loads(done.stdout.split("ADDRESSES", 1)[1].strip().splitlines()[0])
    assert addresses and not [a for a in addresses if not _loopback(a)], \
        f"not on loopback: {[a for a in addresses if not _loopback(a)]} ({_owners(addresses)})"


def _owners(addresses) -> str:
    """Which processes listen where (the lines of ss for the addresses that are not on loopback)."""
    import subprocess

    table = subprocess.run(["ss", "-ltnupH"], capture_output=True, text=True).stdout
    return "; ".join(" ".join(line.split()[4:]) for line in table.splitlines()
                     if any(a in line for a in addresses if not _loopback(a)))[:2000]


@contextlib.contextmanager
def _cluster_of_a_killed_owner(with_watchdog: bool):
    """Start a 2-engine MPICluster in a child process, SIGKILL that child, and yield (cluster file, cluster id,
    {pid: start time} of the processes the cluster started); whatever is still alive at the end is killed."""
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import json, os, time\n"
         "from labkit.cluster import MPICluster\nfrom labkit.cluster.processes import process_tree\n"
         "c = MPICluster(2, start_timeout=60).start()\n"
         + ("" if with_watchdog else "c._watchdog.kill()\n") +
         "tree = {k: v for k, v in process_tree(os.getpid()).items() if k != c._watchdog.pid}\n"
         "print('READY', c.cluster.cluster_file, c.cluster.cluster_id, json.dumps(tree), flush=True)\n"
         "time.sleep(300)\n"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    started: dict[int, int] = {}
    try:
        line = owner.stdout.readline()
        assert line.startswith("READY"), line
        _, cluster_file, cluster_id, tree = line.split(" ", 3)
        started.update({int(k): v for k, v in json.loads(tree).items()})
        assert len(started) >= 4, started  # controller, mpiexec (and its proxy), two engines
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        yield cluster_file, cluster_id, started
    finally:
        if owner.poll() is None:
            owner.kill()
        for pid, ticks in started.items():
            if processes.process_alive(pid, ticks):
                os.kill(pid, signal.SIGKILL)


def _wait_until_gone(started: dict[int, int], seconds: float, also=lambda: False) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (any(processes.process_alive(p, t) for p, t in started.items()) or also()):
        time.sleep(0.5)
    return [p for p, t in started.items() if processes.process_alive(p, t)]


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.mpi
def test_a_cluster_whose_owner_is_killed_is_stopped():
    """SIGKILL the process that started an MPICluster: its watchdog stops controller, mpiexec, engines and nannies."""
    with _cluster_of_a_killed_owner(with_watchdog=True) as (cluster_file, _, started):
        left = _wait_until_gone(started, 30, also=lambda: os.path.exists(cluster_file))
        assert not left and not os.path.exists(cluster_file), (left, cluster_file)


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.mpi
def test_cluster_list_and_stop_find_a_left_behind_cluster(capsys):
    """A cluster whose owner and watchdog both died: doctor and `labkit cluster list` show it, `stop ID` stops it
    (by its id, so that running the tests never stops a cluster of a notebook that is open meanwhile)."""
    from labkit import cli, doctor

    with _cluster_of_a_killed_owner(with_watchdog=False) as (_, cluster_id, started):
        assert any(processes.process_alive(p, t) for p, t in started.items())  # left behind
        assert cluster_id in doctor.check_clusters()[0].detail
        assert cli.main(["cluster", "list"]) == 0 and cluster_id in capsys.readouterr().out
        assert cli.main(["cluster", "stop", cluster_id]) == 0 and f"stopped {cluster_id}" in capsys.readouterr().out
        assert cli.main(["cluster", "stop", "no-such-id"]) == 1 and "no running cluster no-such-id" in capsys.readouterr().err
        assert not _wait_until_gone(started, 20)
