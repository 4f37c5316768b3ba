"""Processes on this machine, read from /proc: a process tree with start times (a pid and its start time name one
process even after pids are reused), whether one still runs, and killing a set of them until none is left.
The cluster, the namespace hosts, SLURM's test cluster and the grader's sandbox all end what they started with these."""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from pathlib import Path


def kill_until_gone(pids_now, wait: float = 10.0) -> bool:
    """SIGKILL the processes ``pids_now()`` lists until it lists none (a fork bomb keeps forking while it is killed),
    for at most ``wait`` seconds; whether none is left."""
    deadline = time.monotonic() + wait
    while pids := list(pids_now()):
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # gone meanwhile, or not ours
                pass
        time.sleep(0.05)
    return True


def process_tree(root: int) -> dict[int, int]:
    """Every live descendant of process ``root``, with its start time (clock ticks since boot, from /proc): a pid and
    its start time name one process even after pids are reused. Empty where there is no /proc."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for d in entries:
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(d))
                ticks[int(d)] = int(fields[19])
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found[c] = ticks[c]
                todo.append(c)
    return found


def process_alive(pid: int, ticks: int | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie), and is the one that started at ``ticks`` when given."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # no /proc (macOS): the pid alone
            return ticks is None
        except OSError:
            return False
    return fields[0] != "Z" and (ticks is None or int(fields[19]) == ticks)


def listening_on(address: str) -> list[int]:
    """The processes (other than this one) with a TCP socket listening on ``address`` (IPv4), read from /proc: a
    server bound to a namespace host's bridge, say, which would outlive the bridge's address."""
    want = ipaddress.IPv4Address(address).packed[::-1].hex().upper()  # /proc/net/tcp: little-endian hex
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]  # this network namespace's sockets
    except OSError:
        return []
    inodes = {f"socket:[{f[9]}]" for f in map(str.split, rows)
              if len(f) > 9 and f[3] == "0A" and f[1].split(":")[0] == want}  # 0A: LISTEN
    if not inodes:
        return []
    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        if pid == os.getpid():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                found.append(pid)
        except OSError:
            continue
    return found

