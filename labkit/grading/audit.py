"""Escape attempts of a graded notebook: noted inside its kernel by an audit hook, read by the grader after the run.

The sandbox (:mod:`.sandbox`) contains what a submission tries, and says nothing of it. So the graded kernel starts
through this module, ``python -m labkit.grading.audit --own DIR ... -- ipykernel_launcher -f CONNECTION_FILE``: it
adds an audit hook (:func:`sys.addaudithook`, which Python code cannot remove) and then runs ``ipykernel_launcher`` as
``python -m`` would, so that the hook is in place before any of the student's code runs. It notes each attempt that
the sandbox refuses:

- **write**: a file opened for writing, removed, renamed, made, linked, chmod-ed, chown-ed..., or a folder removed
  (``shutil.rmtree``), outside the notebook's folder and its private temporary folders (or there, into a folder that
  is not there: the grader's, which the sandbox's private ``/tmp`` lacks);
- **read**: a file opened for reading that is there and unreadable, or in a folder that is not there or cannot be
  searched (bubblewrap leaves out what the notebook may not read), outside the notebook's folder and the usual system
  locations (``/usr``, ``/etc``, ``/proc``..., Python, this environment, labkit, the data);
- **connect**: a connection (or a datagram) to an address that is not loopback;
- **kill**: a signal to a process that is not the notebook's, or to a process group holding one: pid 1, every process
  (-1), another user's (the grader's, as a user of its own).

Each note is one tagged line, written on a copy of the kernel's first stderr, which the sandbox's launcher points at
the grader's private ``kernel.log``: outside the sandbox, where the notebook cannot rewrite what was noted.
:func:`read` gives the grader each attempt once, with how many times it was made.

As an unprivileged user of its own (the sandbox without bubblewrap), the notebook has the machine's network and
its shared ``/tmp``: a connection or a write there that it lists may have been made.

What it does not see: a program the kernel starts (MPI ranks, the engines, ``python -c``) runs without the hook; its
forks keep it. A student who knows the hook can silence it from inside the kernel (ctypes, its objects): what it
lists is a lead for a person to read, never a verdict, and the sandbox, not the hook, is what contains the attempt.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import threading
from pathlib import Path

TAG = "LABKIT-ESCAPE "
LIMIT = 20  # distinct attempts kept per notebook
LINES = 1000  # notes one process writes at most: a loop of attempts fills no disk
LINE_BYTES = 4096  # the longest note read back (a target is cut to TARGET_CHARS)
TARGET_CHARS = 300
KINDS = {"write": "wrote", "read": "read", "connect": "connected to", "kill": "signalled"}  # kind: its verb

# where a notebook's honest start-up reads (and fails to read) what it likes
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev", "/run",
          "/opt", "/var/lib", "/var/cache")
# what any process may write: its terminal, the null device, its own descriptors and /proc entries
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts",
           "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/proc/self", "/proc/thread-self")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# event: the (index of a path it writes, index of that path's dir_fd or None) of its arguments
WRITES = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),), "os.rename": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "os.link": ((1, 3),),
    "os.truncate": ((0, None),), "os.utime": ((0, 3),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "os.chflags": ((0, None),), "os.lchflags": ((0, None),), "shutil.rmtree": ((0, 1),),
    "shutil.copyfile": ((1, None),), "shutil.copytree": ((1, None),), "shutil.move": ((0, None), (1, None)),
    "shutil.chown": ((0, None),),
}
CACHED = 4096  # paths whose decision is kept (a notebook opens a few thousand files at start-up)


def _roots(paths) -> tuple[str, ...]:
    """Folders as given and as their links resolve, without "/" (which would hold everything)."""
    out = []
    for p in paths:
        for seen in (os.path.abspath(str(p)), os.path.realpath(str(p))):
            if seen != "/" and seen not in out:
                out.append(seen)
    return tuple(out)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


class Watch:
    """The hook's decisions: which audit events are escape attempts, given the notebook's own folders (``own``, read
    and written), its private temporary folders (``temp``, written) and what it reads besides the system
    (``system``)."""

    def __init__(self, own=(), temp=(), system=()):
        self.own, self.temp = _roots(own), _roots(temp)
        self.system = _roots([*SYSTEM, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                              Path(__file__).resolve().parent.parent, *system])
        self.cache: dict[tuple[str, str], str | None] = {}
        self.handlers = {"open": self._open, "socket.connect": self._connect, "socket.sendto": self._connect,
                         "socket.sendmsg": self._connect, "os.kill": self._kill, "os.killpg": self._killpg,
                         **dict.fromkeys(WRITES, self._writes)}

    def decide(self, event: str, args: tuple) -> list[tuple[str, str]]:
        """The attempts one audit event is: [(kind, target)], [] for all that a notebook may do."""
        handler = self.handlers.get(event)
        return handler(event, args) if handler is not None else []

    # -- files ------------------------------------------------------------------------------------------------------

    def _open(self, event: str, args: tuple) -> list[tuple[str, str]]:
        path, mode, flags = args
        if isinstance(path, int):  # an open descriptor: decided when it was opened
            return []
        writes = bool((flags or 0) & WRITE_FLAGS) or (isinstance(mode, str) and any(c in mode for c in "wax+"))
        return self._write(path, None) if writes else self._read(path)

    def _writes(self, event: str, args: tuple) -> list[tuple[str, str]]:
        found = []
        for i, fd_at in WRITES[event]:
            if i < len(args):
                found += self._write(args[i], args[fd_at] if fd_at is not None and fd_at < len(args) else None)
        return found

    def _write(self, path, dir_fd) -> list[tuple[str, str]]:
        where = _absolute(path, dir_fd)
        if where is None or ("write", where) in self.cache:  # only what a notebook may write is kept
            return []
        real = os.path.realpath(where)
        if _under(where, DEVICES) or _under(real, self.own) or _under(real, DEVICES):
            self._keep(("write", where), None)
            return []
        if _under(real, self.temp) and os.path.isdir(os.path.dirname(real)):
            return []  # into a folder of its private /tmp; the grader's folders there are absent from the sandbox's
        if "/__pycache__/" in real + "/" and _from_importlib():
            return []  # Python caching a module's bytecode beside it (a read-only folder refuses it): not the student
        return [("write", real)]

    def _read(self, path) -> list[tuple[str, str]]:
        where = _absolute(path, None)
        if where is None or ("read", where) in self.cache:  # only what a notebook may read is kept
            return []
        real = os.path.realpath(where)
        if (_under(real, self.own) or _under(where, self.system) or _under(real, self.system)
                or not _refused(real)):
            self._keep(("read", where), None)
            return []
        return [("read", real)]

    def _keep(self, key, value) -> None:
        if len(self.cache) >= CACHED:
            self.cache.clear()
        self.cache[key] = value

    # -- the network and other processes ------------------------------------------------------------------------------

    def _connect(self, event: str, args: tuple) -> list[tuple[str, str]]:
        sock, address = args[0], args[1] if len(args) > 1 else None
        family = getattr(sock, "family", None)
        if family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple) or not address:
            return []  # a Unix socket (the kernel's own), or no address (sendmsg on a connected socket)
        host = address[0].decode(errors="replace") if isinstance(address[0], bytes) else str(address[0])
        if _loopback(host):
            return []
        port = address[1] if len(address) > 1 else "?"
        return [("connect", f"[{host}]:{port}" if ":" in host else f"{host}:{port}")]

    def _kill(self, event: str, args: tuple) -> list[tuple[str, str]]:
        pid, sig = args[0], args[1]
        if sig == 0 or pid == 0:  # a probe that signals nothing; its own process group
            return []
        if pid == -1:
            return [("kill", "every process (pid -1)")]
        if pid < 0:
            return self._killpg("os.killpg", (-pid, sig))
        return [("kill", f"pid {pid}")] if _theirs(pid) else []

    def _killpg(self, event: str, args: tuple) -> list[tuple[str, str]]:
        group, sig = args[0], args[1]
        if sig == 0 or group == 0 or group == os.getpgrp():
            return []
        return [("kill", f"process group {group}")] if any(map(_theirs, _members(group))) else []


def _absolute(path, dir_fd) -> str | None:
    """The absolute, normalised path an event names (relative to ``dir_fd`` or the working folder); None for a
    descriptor."""
    if isinstance(path, int) or path is None:
        return None
    path = os.fsdecode(os.fspath(path))
    if not path:
        return None
    if not path.startswith("/"):
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) and dir_fd >= 0 else os.getcwd()
        path = os.path.join(base, path)
    path = os.path.normpath(path)
    return "/" + path.lstrip("/")


def _refused(path: str) -> bool:
    """Whether reading ``path`` is refused: it is there and unreadable, or its folder is not there or cannot be
    searched (what bubblewrap leaves out is simply absent). A file missing from a folder the notebook sees is only
    looked for (a cache not made yet)."""
    if os.access(path, os.F_OK):
        return not os.access(path, os.R_OK)
    return not os.access(os.path.dirname(path), os.X_OK)


def _loopback(host: str) -> bool:
    """Whether a connection to ``host`` stays on this machine's loopback (or names no host at all)."""
    host = host.split("%")[0].strip("[]")
    if host in ("", "localhost") or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name: the network's
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or ip.is_unspecified or bool(mapped and mapped.is_loopback)


def _theirs(pid: int) -> bool:
    """Whether ``pid`` is a live process that is not the notebook's: pid 1, or a process of another user. Every other
    process it can see is its own (bubblewrap's PID namespace shows it no other; a user of its own runs nothing else),
    even one its parent left; a process gone by now (a job's group, ended before its cleanup) is nobody's."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return False
    return pid == 1 or owner != os.geteuid()


def _members(group: int) -> list[int]:
    """The live processes of process group ``group``, read from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[2]) == group:
                        found.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _from_importlib() -> bool:
    """Whether the audited call came from Python's import system (the first frame outside this module)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith("<frozen importlib")


# ---- in the kernel ---------------------------------------------------------------------------------------------------

def install(watch: Watch, fd: int) -> None:
    """Add the audit hook: each attempt ``watch`` finds is a tagged line on ``fd``. The hook never raises into the
    student's code (an interrupt still passes), and an event it causes itself is not audited again."""
    busy = threading.local()
    written = [0]

    def hook(event, args):
        handler = watch.handlers.get(event)
        if handler is None or getattr(busy, "on", False):
            return
        busy.on = True
        try:
            for kind, target in handler(event, args):
                if written[0] < LINES:
                    written[0] += 1
                    note = json.dumps({"kind": kind, "target": str(target)[:TARGET_CHARS]})
                    os.write(fd, f"\n{TAG}{note}\n".encode())
        except Exception:  # noqa: BLE001 - whatever goes wrong here, the student's call goes on as without the hook
            pass
        finally:
            busy.on = False

    sys.addaudithook(hook)


def kernel_argv(own=(), temp=(), system=()) -> list[str]:
    """The command of a graded kernel: this module, with the notebook's folders, then ``ipykernel_launcher``."""
    argv = [sys.executable, "-m", "labkit.grading.audit"]
    for flag, paths in (("--own", own), ("--temp", temp), ("--system", system)):
        for p in paths:
            argv += [flag, str(p)]
    return [*argv, "--", "ipykernel_launcher", "-f", "{connection_file}"]


def main(argv=None) -> int:
    """``python -m labkit.grading.audit [--own DIR] [--temp DIR] [--system DIR] -- MODULE ARGS...``: the hook, then
    ``python -m MODULE ARGS...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    given: dict[str, list[str]] = {"--own": [], "--temp": [], "--system": []}
    split = argv.index("--") if "--" in argv else -1
    pairs = list(zip(argv[:split:2], argv[1:split:2]))
    if split < 0 or split + 1 >= len(argv) or split % 2 or any(flag not in given for flag, _ in pairs):
        print("usage: python -m labkit.grading.audit [--own DIR] [--temp DIR] [--system DIR] -- MODULE ARGS...",
              file=sys.stderr)
        return 2
    for flag, value in pairs:
        given[flag].append(value)
    import runpy
    import tempfile

    # ipykernel names each cell's code after a file of its own folder in /tmp, which a traceback looks for
    own = [*given["--own"], os.path.join(tempfile.gettempdir(), f"ipykernel_{os.getpid()}")]
    install(Watch(own, given["--temp"], given["--system"]), os.dup(2))  # stderr, before ipykernel takes it

    module = argv[split + 1]
    sys.argv = [module, *argv[split + 2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


# ---- in the grader -----------------------------------------------------------------------------------------------------

def read(log: Path | str, limit: int = LIMIT) -> list[dict]:
    """The attempts noted in a kernel's log: each (kind, target) once, with how many times it was noted, in the order
    first noted; at most ``limit``. Nothing where the log is missing."""
    counts: dict[tuple[str, str], int] = {}
    try:
        f = open(log, "rb")
    except OSError:
        return []
    with f:
        while line := f.readline(LINE_BYTES):  # a note starts its line; a longer line comes in pieces, none a note
            note = parse(line)
            if note is not None and (note in counts or len(counts) < limit):
                counts[note] = counts.get(note, 0) + 1
    return [{"kind": kind, "target": target, "count": n} for (kind, target), n in counts.items()]


def parse(line: bytes | str) -> tuple[str, str] | None:
    """(kind, target) of one note line, or None for any other line."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if not line.startswith(TAG):
        return None
    try:
        note = json.loads(line[len(TAG):])
        kind, target = note["kind"], note["target"]
    except (ValueError, KeyError, TypeError):
        return None
    if kind not in KINDS or not isinstance(target, str):
        return None
    return kind, target[:TARGET_CHARS]


def describe(entry: dict) -> str:
    """One attempt in words: "wrote /usr/lib/x", "connected to 192.0.2.1:80"."""
    return f"{KINDS.get(entry.get('kind'), entry.get('kind'))} {entry.get('target')}"


if __name__ == "__main__":
    from labkit.grading.audit import main as _main

    sys.exit(_main())
