"""labkit's allreduce algorithms against the MPI library's ``MPI_Allreduce``, on 2 and 4 ranks.

Run: ``labkit bench allreduce [--quick] [--json] [--hosts N]``

Each rank count is one ``mpiexec`` job of this module in worker mode; every algorithm is timed at
every size in that same job (the slowest rank's time, median of several calls), so the ratios compare
like with like. Keys ``ring_vs_mpi_1e6_p2`` and ``ring_vs_mpi_1e7_p2`` are ring time / MPI time.
Algorithm bandwidth is N * 8 bytes / time; bus bandwidth multiplies it by 2 (p - 1) / p, the share
of the data each rank must send at least.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time

import numpy as np

from ..bench import format_seconds, machine_info
from ..cluster import run_mpi
from ..cluster.hosts import namespace_hosts
from ..costmodel import measure_link_rate, time_collective
from ..progress import progress_bar

TARGETS = {"ring_vs_mpi_1e6_p2": ("<=", 1.3), "ring_vs_mpi_1e7_p2": ("<=", 1.0)}
ALGORITHMS = ("naive", "recursive_doubling", "ring", "mpi")


def worker(cfg: dict) -> None:
    """Runs on every rank: time each algorithm at each size; rank 0 prints one JSON line."""
    from mpi4py import MPI

    from .. import collectives as C

    comm = MPI.COMM_WORLD
    rows = []
    for n in cfg["sizes"]:
        x = np.random.default_rng(comm.Get_rank()).random(int(n))
        want = C.mpi_allreduce(comm, x)
        row = {"n": int(n)}
        for name in ALGORITHMS:
            fn = C.ALLREDUCES[name]
            np.testing.assert_allclose(fn(comm, x, check=False), want, rtol=1e-12)  # validated before timed
            repeat = cfg["repeat"] if n < 5e6 else max(3, cfg["repeat"] // 2)
            row[name] = time_collective(comm, fn, x, repeat=repeat, check=False)
        rows.append(row)
    if comm.Get_rank() == 0:
        print(json.dumps({"p": comm.Get_size(), "rows": rows}), flush=True)


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None, hosts: int = 0,
        link: str | None = None) -> dict:
    """One mpiexec job per rank count and round, the rounds interleaved (3, 1 with ``quick``); every time is the
    median over the rounds, each round's kept under ``seconds_per_round``.

    ``hosts`` > 1 adds jobs of one rank on each of that many namespace hosts (:mod:`labkit.cluster.hosts`, root only): every
    message crosses between hosts over TCP, and the keys ``ring_vs_mpi_1e6_hostsN`` sit beside the one-host ones.
    ``link`` ("100mbit", ...) shapes their cables to that rate; ``link_rate_measured_vs_set`` is then the rate a
    ping-pong between two of them got, over the rate asked for (target 0.8-1.2)."""

    ranks = (2,) if quick else (2, 4)
    rounds = (1 if quick else 3) if rounds is None else rounds
    sizes = [1e3, 1e5, 1e6, 1e7] if quick else [1e3, 1e4, 1e5, 1e6, 1e7]
    cfg = {"sizes": sizes, "repeat": 5 if quick else 9}
    if link is not None and hosts < 2:
        raise ValueError("a link rate shapes the cables between namespace hosts: give hosts=2 or more with it")
    configs = [(p, None) for p in ranks] + ([(hosts, "hosts")] if hosts > 1 else [])
    jobs: dict = {c: [] for c in configs}
    rate = None
    with contextlib.ExitStack() as stack:
        made = stack.enter_context(namespace_hosts(hosts, link=link)) if hosts > 1 else None
        if link is not None:
            rate = measure_link_rate(made, repeat=3)
        with progress_bar(total=rounds * len(configs), enable=progress, desc="allreduce bench", unit="job") as bar:
            for r in range(rounds):
                k = r % len(configs)
                for p, where in configs[k:] + configs[:k]:
                    res = run_mpi(["-m", "labkit.benchmarks.allreduce", json.dumps(cfg)], n=p, timeout=900,
                                  hosts=made if where else None)
                    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
                    if res.returncode != 0 or not lines:
                        raise RuntimeError(f"the {p}-rank benchmark job{' across hosts' if where else ''} failed "
                                           f"(exit {res.returncode}):\n{res.stderr[-3000:]}")
                    jobs[(p, where)].append(json.loads(lines[-1])["rows"])
                    bar.update(1)
    result = {"benchmark": "allreduce", "quick": quick, "rounds": rounds, "dtype": "float64", "sizes": sizes,
              "ranks": list(ranks), "hosts": hosts if hosts > 1 else None, "link": link, "machine": machine_info(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
    for (p, where), per_round in jobs.items():
        for i, n in enumerate(int(row["n"]) for row in per_round[0]):
            each = {a: [rows[i][a] for rows in per_round] for a in ALGORITHMS}
            t = {a: float(np.median(v)) for a, v in each.items()}
            ratio = {a: float(np.median(np.array(each[a]) / np.array(each["mpi"]))) for a in ALGORITHMS}
            entry = {"p": p, "hosts": p if where else 1, "n": n, "seconds": t, "seconds_per_round": each, "vs_mpi": ratio,
                     "algbw_GBs": {a: n * 8 / t[a] / 1e9 for a in ALGORITHMS},
                     "busbw_GBs": {a: n * 8 * 2 * (p - 1) / p / t[a] / 1e9 for a in ALGORITHMS}}
            result["rows"].append(entry)
            result[f"ring_vs_mpi_1e{round(np.log10(n))}_{f'hosts{p}' if where else f'p{p}'}"] = ratio["ring"]
    targets = dict(TARGETS)
    if rate is not None:
        result["link_rate"] = rate
        result["link_rate_measured_vs_set"] = rate["ratio"]
        targets["link_rate_measured_vs_set"] = ("within", (0.8, 1.2))
    if hosts > 1:
        targets.update({f"ring_vs_mpi_1e6_hosts{hosts}": ("<=", 1.3), f"ring_vs_mpi_1e7_hosts{hosts}": ("<=", 1.3)})
    result["targets"] = {k: [op, v] for k, (op, v) in targets.items()}
    result["targets_met"] = {k: (v[0] <= result[k] <= v[1] if op == "within" else result[k] <= v)
                             for k, (op, v) in targets.items() if k in result}
    return result


def report(result: dict) -> str:
    """A table for people."""
    m = result["machine"]
    lines = [f"allreduce benchmark ({'quick' if result['quick'] else 'full'}, float64, {m['cpus']} CPUs); "
             f"time per call and ratio to MPI_Allreduce, medians of {result.get('rounds', 1)} interleaved round(s)", "",
             f"{'p':>2} {'hosts':>5} {'N':>9}" + "".join(f"{a:>24}" for a in ALGORITHMS)]
    for e in result["rows"]:
        cells = "".join(f"{format_seconds(e['seconds'][a]):>14} ({e['vs_mpi'][a]:5.2f}x)" for a in ALGORITHMS)
        lines.append(f"{e['p']:>2} {e.get('hosts', 1):>5} {e['n']:>9.0e}{cells}")
    lines.append("")
    if result.get("link"):
        lines.append(f"cables between the hosts shaped to {result['link']}; a ping-pong got "
                     f"{result['link_rate']['bits_per_second'] / 1e6:.0f} Mbit/s")
    targets = result.get("targets") or {k: list(v) for k, v in TARGETS.items()}
    for k, (op, bound) in targets.items():
        if k in result:
            bound = f"{bound[0]:g}-{bound[1]:g}" if op == "within" else f"{bound:g}"
            lines.append(f"{k} = {result[k]:.2f}  (target {op} {bound}: "
                         f"{'met' if result['targets_met'][k] else 'NOT met'})")
    return "\n".join(lines)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
