"""`labkit doctor`: what this machine offers the labs, each item checked for real.

Run: ``labkit doctor``
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import ipaddress
import os
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass

from . import settings
from .bench import machine_info
from .cluster import address_toward, loopback_preload, mpiexec_path, run_mpi, running_clusters
from .cluster.hosts import NamespaceHosts
from .data import DATASETS, DataError, locate
from .device import gpu_status
from .kernels import tools

OK, MISSING, FAIL = "ok", "absent", "FAIL"


@dataclass
class Finding:
    """One line of the doctor's report: ``status`` is "ok", "absent" (optional and not there) or "FAIL"."""

    item: str
    status: str
    detail: str


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def check_python() -> list[Finding]:
    info = machine_info()
    venv = "virtual environment" if sys.prefix != sys.base_prefix else "system interpreter (not a venv)"
    out = [Finding("Python", OK, f"{info['python']} at {sys.executable} ({venv})"),
           Finding("NumPy / BLAS", OK, f"NumPy {info['numpy']}, {info.get('blas', 'unknown BLAS')}, "
                                       f"{info.get('blas_threads', '?')} BLAS threads, {info['cpus']} CPUs")]
    return out


def check_gpu() -> list[Finding]:
    ok, why = gpu_status()
    out = [Finding("CUDA device", OK if ok else MISSING, f"{why} (a test kernel ran)" if ok else why)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        try:
            v = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[-1]
            out.append(Finding("nvcc", OK, f"{nvcc}: {v}"))
        except (OSError, subprocess.TimeoutExpired, IndexError) as e:
            out.append(Finding("nvcc", FAIL, f"{nvcc} does not run: {e}"))
    else:
        out.append(Finding("nvcc", MISSING, "not on PATH (only needed to compile-check kernels without a GPU)"))
    out.append(check_nvrtc())
    out.append(check_gpu_compile())
    out.append(check_emulator())
    return out


def check_gpu_compile() -> Finding:
    """The compiler the kernel checks give every student kernel (labkit.kernels.tools: NVRTC from its wheel, a
    toolkit or CuPy, else nvcc), shown by compiling a test kernel for every modelled GPU's architecture; no GPU needed."""
    tool = tools.compiler_for_check()
    if tool is None:
        return Finding("kernel checks' GPU compiler", MISSING, tools.NO_COMPILER)
    try:
        for arch in tools.ARCHS:
            tools.compile_check(NVRTC_PROBE, arch)
    except Exception as e:
        return Finding("kernel checks' GPU compiler", FAIL, f"{tool} cannot compile a test kernel: {e}")
    where = tools.nvrtc_library() if tool == "nvrtc" else tools.nvcc()
    return Finding("kernel checks' GPU compiler", OK, f"{tool.upper()} ({where or 'through CuPy'}) compiled a test kernel "
                   f"for {' and '.join(tools.ARCHS)}")


NVRTC_PROBE = 'extern "C" __global__ void probe(float* x) { x[threadIdx.x] *= 2.0f; }'


def check_nvrtc() -> Finding:
    """NVRTC found the way CuPy finds it (a pip wheel, conda's cuda-nvrtc or a system toolkit), shown by compiling a
    kernel with it: what a package is called does not matter, only whether it compiles."""
    if importlib.util.find_spec("cupy") is None:
        return Finding("NVRTC", MISSING, "CuPy is not installed (pip install -e '.[gpu]' brings CuPy with NVRTC)")
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        prog = nvrtc.createProgram(NVRTC_PROBE, "probe.cu", [], [])
        try:
            nvrtc.compileProgram(prog, ["--gpu-architecture=compute_70"])
        finally:
            nvrtc.destroyProgram(prog)
    except Exception as e:  # a missing libnvrtc shows up as an error of any kind
        return Finding("NVRTC", FAIL, f"CuPy cannot compile with NVRTC ({type(e).__name__}: {e}); install it with "
                                      "pip install 'cupy-cuda12x[ctk]', conda install cuda-nvrtc, or a CUDA toolkit")
    return Finding("NVRTC", OK, f"NVRTC {major}.{minor} compiled a test kernel")


def check_settings() -> list[Finding]:
    """The LABKIT_* variables set here, each parsed (a value labkit cannot use is a failure, named)."""
    out = []
    for name, raw in settings.in_force().items():
        try:
            out.append(Finding(name, OK, f"{raw!r} -> {settings.get(name)}"))
        except settings.SettingError as e:
            out.append(Finding(name, FAIL, str(e)))
    return out


def check_emulator() -> Finding:
    """The CPU emulator for CUDA C: a C++ compiler, and one small kernel compiled and run."""
    try:
        import numpy as np

        from .kernels import load
        from .kernels.emulator import compiler

        cxx, version = compiler()
        src = ('extern "C" __global__ void twice(float* x, int n)\n'
               '{ int i = threadIdx.x; __syncthreads(); if (i < n) x[i] *= 2.0f; }\n')
        x = np.arange(4, dtype=np.float32)
        load(src, backend="emulator", checked=False).twice((1,), (8,), (x, np.int32(4)))
        good = x.tolist() == [0.0, 2.0, 4.0, 6.0]
        return Finding("kernel emulator", OK if good else FAIL,
                       f"{cxx} ({version}); a test kernel {'ran' if good else 'gave a wrong result'}")
    except Exception as e:  # no compiler, a compile failure: say which
        return Finding("kernel emulator", FAIL, f"{type(e).__name__}: {e}")


def check_c() -> list[Finding]:
    """Lab 03's C: the C compiler with OpenMP (a function compiled and run on 2 threads), and the sanitizers that the
    exercise checks run students' code under."""
    try:
        import numpy as np

        from . import hostc

        cc, version = hostc.compiler()
        src = "void twice(float* x, int n)\n{\n#pragma omp parallel for\n for (int i = 0; i < n; ++i) x[i] *= 2.0f;\n}\n"
        x = np.arange(4, dtype=np.float32)
        mod = hostc.load(src, openmp=True)
        mod.twice(x, np.int32(4), threads=2)
        good = x.tolist() == [0.0, 2.0, 4.0, 6.0]
        out = [Finding("C and OpenMP", OK if good else FAIL, f"{cc} ({version}); an OpenMP test function ran on "
                       f"{mod.twice.threads_used} threads" + ("" if good else " and gave a wrong result"))]
    except Exception as e:  # no compiler, no OpenMP: say which
        return [Finding("C and OpenMP", FAIL, f"{type(e).__name__}: {e}")]
    try:
        y = np.zeros(4, np.float32)
        hostc.load(src, openmp=True, checked=True).twice(y, np.int32(4), threads=2)
        out.append(Finding("C checked mode", OK, "AddressSanitizer and UBSan run students' C in a child process"))
    except Exception as e:
        out.append(Finding("C checked mode", MISSING, f"{type(e).__name__}: {e} (lab 03's checks need it)"))
    return out


def check_mpi(timeout: float = 60) -> list[Finding]:
    v = _version("mpi4py")
    if not v:
        return [Finding("mpi4py", FAIL, "not installed: pip install -e '.[mpi]' (or conda install mpich mpi4py)")]
    out = [Finding("mpi4py", OK, v)]
    try:
        exe = mpiexec_path()
    except FileNotFoundError as e:
        return out + [Finding("mpiexec", FAIL, str(e))]
    # rank 0 gathers and prints once: lines printed by several ranks can interleave mid-line
    code = ("from mpi4py import MPI; import numpy as np; c = MPI.COMM_WORLD; r = np.zeros(1); "
            "c.Allreduce(np.ones(1) * (c.rank + 1), r); got = c.gather(int(r[0])); "
            "c.rank == 0 and print(c.size, *got, '|', MPI.Get_library_version().splitlines()[0].strip(), flush=True)")
    try:
        res = run_mpi(["-c", code], n=2, timeout=timeout)
        head, _, lib = res.stdout.strip().partition("|")
        good = res.returncode == 0 and head.split() == ["2", "3", "3"]
        detail = f"{exe}; 2 ranks ran an Allreduce: {' '.join(lib.split())}" if good else \
            f"{exe}: a 2-rank test job failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()[-300:]}"
        out.append(Finding("MPI", OK if good else FAIL, detail))
    except subprocess.TimeoutExpired:
        out.append(Finding("MPI", FAIL, f"{exe}: a 2-rank test job did not finish in {timeout:g} s"))
    return out


MPI_PROBE = ("from mpi4py import MPI; import socket; "
             "print('MPI|' + MPI.Get_library_version().splitlines()[0].strip() + '|' + socket.gethostname())")


def _on_host(hosts, host: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run a command on one host the way mpiexec's launcher would: the namespace hosts' script, else ssh."""

    if isinstance(hosts, NamespaceHosts):
        cmd = [str(hosts.launcher), "-x", host, " ".join(shlex.quote(a) for a in argv)]
    else:
        cmd = ["ssh", "-x", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(timeout)}", host,
               " ".join(shlex.quote(a) for a in argv)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _cannot_connect_back(hosts, target, names: list[str], timeout: float) -> list[str]:
    """The hosts that cannot open a TCP connection to this machine at the address they reach it by (as mpiexec's
    proxies must), tried against a listening socket held open for just this."""

    here = target.bridge_address if isinstance(target, NamespaceHosts) else address_toward(names[0])
    failed = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind((here, 0))
        listener.listen(len(names))
        port = listener.getsockname()[1]
        probe = f"import socket; socket.create_connection(({here!r}, {port}), timeout={timeout / 2:g}).close()"
        for host in names:
            try:
                if _on_host(hosts, host, [sys.executable, "-c", probe], timeout).returncode != 0:
                    failed.append(host)
            except subprocess.TimeoutExpired:
                failed.append(host)
    return failed


def check_hosts(hosts, timeout: float = 60) -> list[Finding]:
    """A 2-rank job across the first two of ``hosts`` (names, or :class:`labkit.cluster.hosts.NamespaceHosts`), and before it
    what such a job needs, each named when it fails: the names resolve, the launcher runs a command on each host, the
    same Python and MPI are there, and the hosts can connect back to this one."""
    names = list(hosts.addresses) if isinstance(hosts, NamespaceHosts) else [h.strip() for h in hosts if h.strip()]
    if len(names) < 2:
        return [Finding("hosts", FAIL, f"give at least two hosts (got {names}): --hosts HOST_A,HOST_B")]
    mine = _local_mpi_library(timeout)
    out = [_check_host(hosts, host, mine, timeout) for host in names]
    if any(f.status != OK for f in out):
        return out
    return out + [_job_across_hosts(hosts, names, timeout)]


def _local_mpi_library(timeout: float) -> str:
    """The MPI library that mpi4py reports here (its first line, spaces collapsed), or "?" when the probe fails."""
    here = subprocess.run([sys.executable, "-c", MPI_PROBE], capture_output=True, text=True, timeout=timeout)
    return " ".join(here.stdout.strip().split("|")[1].split()) if here.returncode == 0 and "|" in here.stdout else "?"


def _unresolved(host: str) -> Finding | None:
    """A failure when ``host`` is neither an IP address nor a name that resolves; None when it is either."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, None)
        except OSError as e:
            return Finding(f"host {host}", FAIL, f"name resolution failed ({e}): add it to DNS or /etc/hosts, "
                                                 "or give its address")
    return None


def _check_host(hosts, host: str, mine: str, timeout: float) -> Finding:
    """One host's finding: its name resolves, the launcher runs a command there, the same Python and MPI are there."""
    unresolved = _unresolved(host)
    if unresolved is not None:
        return unresolved
    launcher = "the namespace hosts' launcher" if isinstance(hosts, NamespaceHosts) else "ssh"
    try:
        done = _on_host(hosts, host, [sys.executable, "-c", MPI_PROBE], timeout)
    except subprocess.TimeoutExpired:
        return Finding(f"host {host}", FAIL, f"{launcher} did not come back from {host} in {timeout:g} s")
    if done.returncode == 255 or (done.returncode != 0 and not done.stdout and "python" not in done.stderr.lower()
                                  and "no such file" not in done.stderr.lower()):
        return Finding(f"host {host}", FAIL, f"{launcher} could not run a command on {host}: "
                                             f"{done.stderr.strip()[-200:] or f'exit {done.returncode}'} "
                                             "(mpiexec starts its proxies the same way: set up "
                                             "password-less ssh to every host)")
    if done.returncode != 0 or "MPI|" not in done.stdout:
        return Finding(f"host {host}", FAIL, f"{sys.executable} with mpi4py does not run on {host}: "
                                             f"{done.stderr.strip()[-200:]} (the same environment must be at "
                                             "the same path on every host: a shared home or /opt)")
    theirs, name = done.stdout.strip().split("MPI|", 1)[1].split("|")[:2]
    theirs = " ".join(theirs.split())
    if theirs != mine:
        return Finding(f"host {host}", FAIL, f"a different MPI on {host}: {theirs!r}, here {mine!r}: every "
                                             "host needs the MPI mpi4py was built against")
    return Finding(f"host {host}", OK, f"reached as {name}; {theirs}")


def _job_across_hosts(hosts, names: list[str], timeout: float) -> Finding:
    """A 2-rank Allreduce across the first two hosts; when it fails, whether a firewall-like refusal is why."""
    code = ("from mpi4py import MPI; import numpy as np, socket; c = MPI.COMM_WORLD; r = np.zeros(1); "
            "c.Allreduce(np.ones(1) * (c.rank + 1), r); got = c.gather((int(r[0]), socket.gethostname())); "
            "c.rank == 0 and print('JOB|' + ' '.join(f'{v}@{h}' for v, h in got), flush=True)")
    target = hosts if isinstance(hosts, NamespaceHosts) else names[:2]
    try:
        res = run_mpi(["-c", code], n=2, hosts=target, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Finding("MPI across hosts", FAIL, f"a 2-rank job did not finish in {timeout:g} s: the proxies "
                                                 "started but could not reach mpiexec or each other, as behind a "
                                                 "firewall: open TCP between the hosts, or name the address the "
                                                 "others reach this machine by")
    if res.returncode != 0 or "JOB|" not in res.stdout:
        text = (res.stderr or res.stdout).strip()
        refused = any(w in text.lower() for w in ("refused", "unable to connect", "no route", "unreachable", "timed out"))
        # hydra may end the job before a proxy's own "unable to connect" reaches it: ask each host directly
        refused = refused or bool(_cannot_connect_back(hosts, target, names[:2], min(timeout, 15)))
        why = ("a firewall-like refusal: the hosts could not connect to each other or back to mpiexec"
               if refused else "the job failed")
        return Finding("MPI across hosts", FAIL, f"{why}: {text[-300:]}")
    ranks = res.stdout.split("JOB|", 1)[1].split()
    return Finding("MPI across hosts", OK, f"2 ranks ran an Allreduce: {' '.join(ranks)}")


def check_tools() -> list[Finding]:
    out = []
    for item, dist in (("ipyparallel", "ipyparallel"), ("JupyterLab", "jupyterlab"), ("nbclient", "nbclient")):
        v = _version(dist)
        out.append(Finding(item, OK if v else FAIL, v or f"not installed: pip install {dist}"))
    if importlib.util.find_spec("ipykernel") is None:
        out.append(Finding("ipykernel", FAIL, "not installed: notebooks cannot run (pip install ipykernel)"))
    return out


def check_data() -> list[Finding]:
    out = []
    for ds in DATASETS:
        try:
            src = locate(ds)
            out.append(Finding(f"data: {ds}", OK if src.kind == "files" else MISSING, src.describe()))
        except DataError as e:
            out.append(Finding(f"data: {ds}", FAIL, str(e)))
    return out


def check_loopback() -> Finding:
    """Whether jobs on this machine keep hydra's control port on loopback (see cluster.loopback_preload)."""
    if loopback_preload() is not None:
        return Finding("MPI on loopback", OK, "jobs on this machine listen on 127.0.0.1 only")
    return Finding("MPI on loopback", MISSING, "hydra's control port listens on every interface while a job runs: "
                                               "install a C compiler (Debian: apt install gcc) so labkit can keep it "
                                               "on 127.0.0.1")


def check_clusters() -> list[Finding]:
    """ipyparallel clusters still running: a notebook's, or one left behind by a kernel that died."""
    try:
        running = running_clusters()
    except Exception as e:  # noqa: BLE001 - ipyparallel missing or its files unreadable: said, not fatal
        return [Finding("clusters", MISSING, f"could not list ipyparallel clusters: {type(e).__name__}: {e}")]
    if not running:
        return [Finding("clusters", OK, "no ipyparallel cluster running")]
    ids = ", ".join(c.cluster_id for c in running)
    return [Finding("clusters", MISSING, f"{len(running)} running ({ids}); if no open notebook uses them, "
                                         "`labkit cluster stop --all` stops them")]


def check_slurm(timeout: float = 15) -> Finding:
    """Whether this is a SLURM cluster's node: its partitions and how many nodes are idle (``sinfo``), or why not."""
    if shutil.which("sinfo") is None:
        return Finding("SLURM", MISSING, "not a SLURM cluster here (no sinfo): MPICluster(launcher='slurm') and "
                                         "run_mpi(hosts='slurm') need one")
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):  # sinfo would retry for a minute
        return Finding("SLURM", FAIL, f"SLURM_CONF names {conf}, which does not exist: fix or unset it")
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%R %a %D %t"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Finding("SLURM", FAIL, f"sinfo did not answer within {timeout:g} s: is slurmctld reachable? "
                                      "(scontrol ping)")
    if "configuration source" in done.stderr:  # the client is installed, and no cluster is set up for it
        return Finding("SLURM", MISSING, "SLURM's commands are here but name no cluster (no slurm.conf, no SLURM_CONF)")
    if done.returncode != 0:
        return Finding("SLURM", FAIL, f"sinfo failed: {(done.stderr or done.stdout).strip()[:300]}")
    parts: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        name, avail, count, state = (line.split() + ["?"] * 4)[:4]
        parts.setdefault(name, []).append(f"{count} {state}" + ("" if avail == "up" else f" ({avail})"))
    where = "; ".join(f"{p}: {', '.join(v)}" for p, v in parts.items()) or "no partitions"
    inside = f" (this runs inside job {os.environ['SLURM_JOB_ID']})" if "SLURM_JOB_ID" in os.environ else ""
    return Finding("SLURM", OK, f"{where}{inside}")


def run_all() -> list[Finding]:
    """Every check, in the order of the labs."""
    return (check_python() + check_settings() + check_data() + check_c() + check_gpu() + check_mpi() + [check_loopback()]
            + check_clusters() + [check_slurm()] + check_tools())


def render(findings: list[Finding]) -> str:
    """Aligned lines with a mark per finding."""
    mark = {OK: "✔", MISSING: "–", FAIL: "✘"}
    width = max(len(f.item) for f in findings)
    return "\n".join(f"{mark[f.status]} {f.item:<{width}}  {f.detail}" for f in findings)
