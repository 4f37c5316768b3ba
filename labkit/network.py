"""The labs' network that costs: their communication experiments run across namespace hosts whose cables are shaped
to a bandwidth, so that a message costs what it costs between machines instead of a memory copy.

A lab opens one with :func:`costly_network` and runs its experiment through :meth:`Wire.run`::

    with network.costly_network(hosts=4, link="100mbit") as wire:
        print(wire.setting)                      # which setting this measured, in a sentence
        times = wire.run("labkit.costmodel:allreduce_times", ranks=4, sizes=[1000, 250_000])

``Wire.run`` starts ``ranks`` MPI processes under ``mpiexec`` (one per host, round robin), calls the named function
as ``function(comm, **kwargs)`` on every rank, and returns rank 0's result (anything JSON can hold; NumPy arrays
and numbers become lists and floats). The hosts, their cables and every process are gone when the ``with`` ends,
also when the body fails.

Where hosts cannot be made (not root, no ``ip`` or ``tc``), or ``LABKIT_SHAPED_HOSTS=0`` says not to, the same
calls run on this machine and :attr:`Wire.setting` says so and why: a lab then reads its results as one machine's.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from . import settings
from .cluster import run_mpi
from .cluster.hosts import HostsUnavailable, NamespaceHosts, namespace_hosts, rate_bits_per_second, shaping_available

DEFAULT_LINK = "100mbit"
RESULT = "WIRE RESULT "  # the line rank 0 prints its result on


@dataclass
class Wire:
    """Where a lab's communication experiment runs: ``hosts`` (namespace hosts with shaped cables) or, when they
    could not be made, this machine (``hosts`` None, ``why_not`` saying why)."""

    hosts: NamespaceHosts | None
    link: str | None
    why_not: str | None = None

    @property
    def shaped(self) -> bool:
        """True where the experiment runs across hosts whose cables have a bandwidth."""
        return self.hosts is not None and self.link is not None

    @property
    def bits_per_second(self) -> float | None:
        """The cables' rate (None on one machine)."""
        return rate_bits_per_second(self.link) if self.shaped else None

    @property
    def setting(self) -> str:
        """One sentence: what the measurements of this wire were taken on."""
        if self.shaped:
            rate = self.bits_per_second
            speed = f"{rate / 1e9:g} Gbit/s" if rate >= 1e9 else f"{rate / 1e6:g} Mbit/s"
            return (f"measured across {len(self.hosts.names)} namespace hosts, each with its own cable shaped to {speed} "
                    "each way (TCP between hosts, ranks spread over the hosts in turn)")
        return (f"measured on this machine only, where a message is a memory copy: {self.why_not}. "
                "The figures below are one machine's, not a network's")

    def run(self, function: str, ranks: int, timeout: float = 600.0, **kwargs):
        """``function(comm, **kwargs)`` ("package.module:name") on ``ranks`` MPI processes over this wire's hosts
        (or this machine); rank 0's result. A rank's failure raises RuntimeError with the ranks' error output."""
        _resolve(function)  # a wrong name fails here, not on every rank
        cfg = json.dumps({"function": function, "kwargs": kwargs})
        try:
            done = run_mpi(["-m", "labkit.network", cfg], n=ranks, hosts=self.hosts, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{function} on {ranks} ranks did not finish within {timeout:g} s and was stopped; "
                               "give it less work or a larger timeout") from None
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(RESULT)]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{function} on {ranks} ranks failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(lines[-1][len(RESULT):])


@contextlib.contextmanager
def costly_network(hosts: int = 2, link: str = DEFAULT_LINK):
    """``hosts`` namespace hosts joined by cables of ``link`` (a rate as ``tc`` writes it); yields a :class:`Wire`,
    removes every host, cable and process afterwards. Falls back to this machine where hosts cannot be made."""
    rate_bits_per_second(link)  # a bad rate is the caller's mistake on any machine
    if not 2 <= hosts <= 16:
        raise ValueError(f"hosts must be 2..16, got {hosts}")
    if not settings.get("LABKIT_SHAPED_HOSTS"):
        yield Wire(None, None, "LABKIT_SHAPED_HOSTS=0 keeps the labs on one machine")
        return
    ok, why = shaping_available()
    if not ok:
        yield Wire(None, None, why)
        return
    with contextlib.ExitStack() as stack:
        try:
            made = stack.enter_context(namespace_hosts(hosts, link=link))
        except HostsUnavailable as e:  # root, but no namespaces or no tbf here (a container, say)
            made, why = None, f"namespace hosts could not be made here ({e})"
        yield Wire(made, link if made else None, None if made else why)


def _resolve(function: str):
    module, sep, name = function.partition(":")
    if not sep or not module.startswith("labkit.") or not name.isidentifier():
        raise ValueError(f"function must be 'labkit.module:name', got {function!r}")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"{module} has no function {name!r}")
    return fn


def _plain(x):
    """NumPy's arrays and numbers as JSON's lists and numbers."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"a result of type {type(x).__name__} cannot be sent back as JSON")


def worker(cfg: dict) -> None:
    """Runs on every rank of a :meth:`Wire.run` job; rank 0 prints the result."""
    threadpool_limits(1)
    from mpi4py import MPI

    result = _resolve(cfg["function"])(MPI.COMM_WORLD, **cfg["kwargs"])
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(RESULT + json.dumps(result, default=_plain), flush=True)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
