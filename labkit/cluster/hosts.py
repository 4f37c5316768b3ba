"""Several hosts for MPI jobs: real machines by name, or namespace hosts made on this one for tests and benchmarks.

A **namespace host** is a Linux network namespace with an address of its own on a private bridge, entered with a
hostname of its own (a UTS namespace), so that MPICH sees separate hosts and sends between them over TCP instead of
shared memory. :func:`namespace_hosts` makes N of them and removes everything afterwards (processes, namespaces,
interfaces), even when the body fails; it needs root and ``ip``. MPICH's ``mpiexec`` starts its proxies on them
through a launcher script that stands in for ``ssh``: hydra runs ``SCRIPT -x HOST COMMAND``, the script runs
COMMAND in HOST's namespace under HOST's name.

The same :func:`labkit.cluster.run_mpi` call then works for real hosts (hydra's own ``ssh`` launcher) and for these.

A cable can be given a bandwidth, ``namespace_hosts(2, link="100mbit")``: a token-bucket filter (``tc``'s ``tbf``)
on both ends of every host's cable limits what leaves and what enters each host to that rate, as a network card
would, so that a message between hosts costs what it costs on a cluster instead of a memory copy.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ToolMissing
from .processes import kill_until_gone, listening_on

PREFIX = "labkit"


# MPI between namespace hosts as between machines: UCX's and libfabric's shared-memory transports would carry the
# messages through this machine's memory (the namespaces share it), so TCP only, over each host's one interface
# (ranks on one host still share memory through MPICH's own intranode path)
TCP_BETWEEN_HOSTS = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0",
                     "FI_SOCKETS_IFACE": "eth0"}


class HostsUnavailable(ToolMissing):
    """Namespace hosts cannot be made here (not root, no ``ip``, no namespaces): the message says which."""


@dataclass
class NamespaceHosts:
    names: list[str]  # each host's hostname, as MPI reports it
    addresses: list[str]  # each host's address on the bridge
    namespaces: list[str]  # each host's network namespace
    bridge: str
    bridge_address: str  # this machine's address on the bridge: where mpiexec listens for the proxies
    links: list[str]  # this machine's end of each host's cable (veth), for the byte counters
    launcher: Path  # hydra's -launcher-exec: runs a command on a host
    _tmp: Path = field(repr=False, default=None)
    link: str | None = None  # each cable's bandwidth as tc writes it ("100mbit"), or None: as fast as memory copies

    @property
    def link_bits_per_second(self) -> float | None:
        """The cables' bandwidth in bits per second, or None where they are not shaped."""
        return None if self.link is None else rate_bits_per_second(self.link)

    def describe(self) -> str:
        """A line for a notebook: how many hosts, and what their cables carry."""
        cable = f"cables shaped to {self.link}" if self.link else "unshaped cables (a message is a memory copy)"
        return f"{len(self.names)} namespace hosts on one machine, {cable}"

    def interface_bytes(self) -> dict[str, int]:
        """Bytes that crossed each host's cable so far, both ways together (from the kernel's counters)."""
        out = {}
        for name, link in zip(self.names, self.links):
            stats = Path("/sys/class/net") / link / "statistics"
            out[name] = int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())
        return out

    def launch_errors(self) -> str:
        """What the launcher said when it could not start a command (a host it does not know), in every run so far:
        hydra can end the job before it reads the launcher's stderr, so the launcher also keeps it here."""
        log = Path(self.launcher).parent / "launch-errors"
        return log.read_text() if log.exists() else ""

    def run(self, host: int, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run a command on one host (in its namespace, under its name)."""
        return subprocess.run([str(self.launcher), self.addresses[host], *argv], **kw)

    def daemon_argv(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` made to run on one host as a daemon would on a machine of its own: in the host's network and
        name, with a /sys of the host's network (as ``ip netns exec`` gives) that still holds the cgroup
        filesystems (which ``ip netns exec`` hides, and slurmd needs), and an /etc/hosts that names every host, as
        a cluster's name service would."""
        return ["nsenter", f"--net=/run/netns/{self.namespaces[host]}", "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c", DAEMON_SHELL, self.names[host], str(self._tmp / "hosts"),
                *argv]


def available() -> tuple[bool, str]:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "namespace hosts need root (ip netns, veth, a bridge)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return False, f"namespace hosts need {tool} (apt install iproute2 util-linux)"
    return True, ""


RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}  # tc's: bps is bytes per second


def rate_bits_per_second(link: str) -> float:
    """``"100mbit"`` -> 1e8: a rate as ``tc`` writes it (bit, kbit, mbit, gbit; bps... are bytes per second)."""
    m = RATE.match(str(link).strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"link must be a rate as tc writes it, such as '100mbit' or '1gbit', got {link!r}")
    return float(m.group(1)) * RATE_UNITS[m.group(2)]


def shaping_available() -> tuple[bool, str]:
    """Whether cables can be given a bandwidth here (namespace hosts, and ``tc``), and if not, why."""
    ok, why = available()
    if not ok:
        return ok, why
    if shutil.which("tc") is None:
        return False, "shaped cables need tc (apt install iproute2)"
    return True, ""


def _shape(device: str, link: str, namespace: str | None = None) -> None:
    """A token bucket on ``device``'s way out: ``link`` bits per second, bursts of 0.25 ms of it but at least 4000
    bytes (more than one 1500-byte frame, so a full-size packet always fits; a small burst keeps a ping-pong's short
    messages from riding free), a queue of at most 50 ms before packets are dropped."""
    rate = rate_bits_per_second(link)
    burst = max(int(rate / 8 * 0.00025), 4000)
    cmd = ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{int(rate)}bit", "burst", str(burst),
           "latency", "50ms"]
    done = subprocess.run((["ip", "netns", "exec", namespace] if namespace else []) + cmd,
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise HostsUnavailable(f"cannot shape the cable {device} to {link}: {' '.join(cmd)} said "
                               f"{done.stderr.strip() or done.returncode} (the kernel needs the tbf queueing discipline)")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise HostsUnavailable(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=30).stdout
    nets = [ipaddress.ip_interface(tok).network for line in used.splitlines() for tok in line.split()
            if "/" in tok and tok[0].isdigit()]
    for third in list(range(231, 255)) + list(range(0, 231)):
        candidate = ipaddress.ip_network(f"10.{third}.{int(uuid.uuid4().int % 250)}.0/24")
        if not any(candidate.overlaps(n) for n in nets):
            return candidate
    raise HostsUnavailable("no free private /24 in 10.0.0.0/8 for the namespace hosts")


LAUNCHER = """#!/bin/sh
# hydra's stand-in for ssh: {launcher} [-x] HOST COMMAND... runs COMMAND in HOST's namespace under HOST's name
while [ "${{1#-}}" != "$1" ]; do shift; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "no namespace host $host" >&2
     # hydra may end before it reads this line: keep it where run_mpi finds it
     echo "no namespace host $host" >> "$(dirname "$0")/launch-errors"; exit 255 ;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec sh -c "$*"' "$name" "$*"
"""


DAEMON_SHELL = """set -e
hold=$(mktemp -d /tmp/labkit-cgroup-XXXXXX)
mount --rbind /sys/fs/cgroup "$hold"
mount -t sysfs sysfs /sys
mount --move "$hold" /sys/fs/cgroup
rmdir "$hold"
mount --bind "$1" /etc/hosts
shift
hostname "$0"
exec "$@"
"""


def namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _remove(namespaces: list[str], bridge: str | None, tmp: Path | None, links: list[str] = (),
            bridge_address: str | None = None) -> None:
    for ns in namespaces:  # processes first: a namespace is only gone when nothing runs in it
        kill_until_gone(lambda ns=ns: namespace_pids(ns), wait=5.0)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)  # takes its veth end along
    if bridge_address:  # a server here that listens on the bridge for the hosts (an ipyparallel controller whose
        kill_until_gone(lambda: listening_on(bridge_address), wait=5.0)  # owner was killed) ends with them
    for link in links:  # gone with its namespace, unless the kernel keeps it a while
        subprocess.run(["ip", "link", "delete", link], capture_output=True, timeout=30)
    if bridge:
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True, timeout=30)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def namespace_hosts(n: int = 2, link: str | None = None):
    """Make ``n`` namespace hosts joined by a bridge; yield a :class:`NamespaceHosts`; remove all of it after.

    ``link``: each host's cable carries at most this rate each way (``"100mbit"``, ``"1gbit"``, any rate ``tc``
    takes); by default the cables are as fast as this machine copies memory."""
    if link is not None:
        rate_bits_per_second(link)  # a bad rate is the caller's mistake, wherever this runs
    ok, why = available() if link is None else shaping_available()
    if not ok:
        raise HostsUnavailable(why)
    if not 1 <= n <= 16:
        raise ValueError(f"n must be 1..16 hosts, got {n}")
    tag = uuid.uuid4().hex[:6]
    bridge = f"lkb{tag}"
    subnet = _free_subnet()
    hosts = list(subnet.hosts())
    namespaces: list[str] = []
    links: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="labkit-hosts-"))
    made_bridge = bridge_address = None
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made_bridge, bridge_address = bridge, str(hosts[0])
        _ip("addr", "add", f"{hosts[0]}/{subnet.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        names, addresses = [], []
        for i in range(n):
            ns, cable, name, addr = f"{PREFIX}-{tag}-{i}", f"lkv{tag}{i}", f"{PREFIX}-host{i}", str(hosts[i + 1])
            _ip("netns", "add", ns)
            namespaces.append(ns)
            _ip("link", "add", cable, "type", "veth", "peer", "name", "eth0", "netns", ns)
            links.append(cable)
            _ip("link", "set", cable, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/{subnet.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if link is not None:  # both ways: what enters the host (its cable's far end) and what leaves it
                _shape(cable, link)
                _shape("eth0", link, namespace=ns)
            names.append(name)
            addresses.append(addr)
        cases = "\n".join(f"  {shlex.quote(a)}|{shlex.quote(nm)}) ns={shlex.quote(ns)}; name={shlex.quote(nm)} ;;"
                          for a, nm, ns in zip(addresses, names, namespaces))
        (tmp / "hosts").write_text("127.0.0.1 localhost\n" + "".join(f"{a} {nm}\n" for a, nm in zip(addresses, names)))
        launcher = tmp / "launch-on-host"
        launcher.write_text(LAUNCHER.format(launcher=launcher.name, cases=cases))
        launcher.chmod(0o755)
        yield NamespaceHosts(names, addresses, namespaces, bridge, str(hosts[0]), links, launcher, tmp, link)
    finally:
        _remove(namespaces, made_bridge, tmp, links, bridge_address)


def left_behind() -> list[str]:
    """Namespaces named like namespace hosts that still exist (for the tests' last check)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(PREFIX + "-")]
