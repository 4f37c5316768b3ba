"""Distributed training on MNIST: data-parallel speedup and the accuracy cost of top-k compression.

Run: ``labkit bench training [--quick] [--json]``

* ``dp_speedup_p2``: the same epochs of [784,256,10] at batch 128 (ReLU, softmax, momentum), serial
  (one process) against synchronous data parallelism on 2 ranks through shared memory with the update sharded
  over the ranks (``DataParallel(allreduce="shm", shard_update=True)``: the two ranks share a machine), one BLAS
  thread per process; ``dp_speedup_p2_unsharded`` with the shared-memory allreduce and every rank applying the
  whole update, ``dp_speedup_p2_ring`` with labkit's ring allreduce, and ``dp_speedup_p2_no_exchange`` the bound
  of the unsharded design with a free exchange: 2 ranks that send no gradient at all, each applying the whole
  update of its own half batch (only the loss is summed; the weights drift apart, so its accuracy means nothing).
  ``dp_speedup_p2_independent`` is the yardstick for any 2-process design of this loop: two plain processes that
  never talk, each training alone on half the samples in half-size batches (the same number of steps, each with the
  whole update); only per-step overheads, memory contention and the slower rank remain. A synchronous design adds
  an exchange and barriers to that and can gain on it only by sharing the update.
  All runs' test accuracies are reported (they must agree), with the 2-rank runs' compute / communication split.
  Every timed job runs in 3 interleaved rounds (1 with ``--quick``); each configuration's median run is reported.
* ``topk1_accuracy_gap``: [784,100,10] on 2 ranks, the same epochs with a dense ring allreduce and with
  top-k 1 % plus error feedback; dense accuracy minus compressed accuracy, and the bytes ratio.
* ``async_accuracy_w4_m2``: test accuracy of [784,100,10] after 5 epochs (2 in the quick run) of the
  asynchronous parameter server with 4 workers and 2 masters (6 ranks), with its staleness and master loads.

With ``--hosts N [--link RATE]`` (root: namespace hosts, :mod:`labkit.cluster.hosts`) three figures of a network
that costs are added, one rank on each host:

* ``link_rate_measured_vs_set``: the rate a ping-pong between two hosts gets over the cable's rate (0.8-1.2).
* ``overlap_step_vs_blocking_hostsN``: the time of a data-parallel step of :data:`OVERLAP_NETWORK` whose buckets are
  allreduced while backprop runs over the time of the blocking step, in interleaved rounds in one job. The
  overlapped step is moved on as DDP and Horovod move theirs, by a thread beside backprop
  (``DataParallel(overlap=True, progress="thread")``); ``overlap.layers_step_vs_blocking`` is the same step moved on
  only by a test of the requests after every layer (``progress="layers"``), a reading. The batch is chosen from the
  cable's rate so that the allreduce is a little over half of the blocking step (``overlap.allreduce_share`` says
  what it was). Target <= 0.8 where that share is at least one half.
  ``overlap.mpich_async_progress``: the same steps in a job with ``MPIR_CVAR_ASYNC_PROGRESS=1``, MPICH's own
  progress thread, and the overlapped step making no Test calls (``progress="none"``): does this MPI move a
  non-blocking allreduce by itself?
* ``topk_time_to_accuracy_vs_dense_hostsN``: [784,100,10] at batch 64; dense (ring allreduce) trains for some
  epochs, top-k 1 % with error feedback for twice as many; the training time top-k needs to first reach dense's
  final test accuracy over dense's training time (inf where it never does). Target <= 0.7.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from .. import cluster, compression, mlp
from ..bench import machine_info
from ..cluster.hosts import namespace_hosts
from ..costmodel import measure_link_rate
from ..data import load_mnist, locate
from ..data_parallel import DataParallel
from ..progress import progress_bar

TARGETS = {"dp_speedup_p2": (">=", 1.6), "topk1_accuracy_gap": ("<=", 0.01), "async_accuracy_w4_m2": (">=", 0.95)}
OVERLAP_NETWORK = [784, 512, 512, 512, 512, 512, 10]
ASYNC_PROGRESS = "MPIR_CVAR_ASYNC_PROGRESS"  # MPICH: a progress thread of its own in every rank


def hosts_targets(hosts: int) -> dict:
    """The targets of the figures measured across ``hosts`` namespace hosts."""
    return {"link_rate_measured_vs_set": ("within", (0.8, 1.2)), f"overlap_step_vs_blocking_hosts{hosts}": ("<=", 0.8),
            f"topk_time_to_accuracy_vs_dense_hosts{hosts}": ("<=", 0.7)}


def overlap_batch(bits_per_second: float | None) -> int:
    """A global batch whose backprop of :data:`OVERLAP_NETWORK` on one core takes a little less than the allreduce of
    its gradient over a cable of this rate (measured here on 2 hosts at 100 Mbit/s: backprop 0.49 s at batch 14,080
    and 0.43 s at 12,288, the allreduce of its 5.9 MB 0.52 s, a share of 0.52 and 0.55); 256..16384, a multiple of
    256."""
    if not bits_per_second:
        return 256
    return int(min(16384, max(256, round(1.2e12 / bits_per_second / 256) * 256)))


def worker(cfg: dict) -> None:
    """Runs on every rank of one job; rank 0 prints one JSON line."""
    threadpool_limits(1)

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    (x, y), (xt, yt) = load_mnist(quiet=True)
    x, y = x[: cfg["samples"]], y[: cfg["samples"]]
    out = {"p": comm.Get_size(), "samples": len(x)}  # at most the 10,000 of the shipped subset
    if cfg["part"] == "dp" and cfg.get("independent"):  # the bound with no communication at all: see the docstring
        params = mlp.init_params([784, 256, 10], seed=0, init="he")
        r, p = comm.Get_rank(), comm.Get_size()
        h = mlp.train(params, (x[r::p], y[r::p]), epochs=cfg["epochs"], batch_size=128 // p, lr=0.05, momentum=0.9,
                      activation="relu", cost="cross_entropy", test_data=(xt, yt), progress=False)
        out.update(seconds=comm.allreduce(sum(h.epoch_time), op=MPI.MAX), accuracy=h.final_accuracy)
    elif cfg["part"] == "dp":
        params = mlp.init_params([784, 256, 10], seed=0, init="he")
        allreduce = cfg.get("allreduce", "ring")
        if allreduce == "none":  # the bound: no gradient exchanged at all (only the loss is summed); weights diverge
            allreduce = _no_exchange
        method = (DataParallel(comm, allreduce=allreduce, shard_update=cfg.get("shard_update", False))
                  if comm.Get_size() > 1 else "vectorised")
        h = mlp.train(params, (x, y), epochs=cfg["epochs"], batch_size=128, lr=0.05, momentum=0.9, activation="relu",
                      cost="cross_entropy", method=method, test_data=(xt, yt), progress=False)
        out.update(seconds=sum(h.epoch_time), accuracy=h.final_accuracy)
        if comm.Get_size() > 1:
            out.update(compute_seconds=method.compute_seconds, comm_seconds=method.comm_seconds)
            method.close()
    elif cfg["part"] == "async":
        from .. import param_server

        res = param_server.train(comm, [784, 100, 10], (x, y), masters=2, mode="async", epochs=cfg["epochs"],
                                 batch_size=32, lr=0.05, timeout=300)
        if comm.Get_rank() == 0:
            out.update(accuracy=mlp.accuracy(res.params, xt, yt, "relu", "cross_entropy"), seconds=res.seconds,
                       staleness_mean=float(res.staleness.mean()), staleness_max=int(res.staleness.max()),
                       staleness_histogram=np.bincount(res.staleness).tolist(), master_updates=res.master_updates.tolist())
    elif cfg["part"] == "overlap":
        out.update(_overlap_steps(comm, cfg), async_progress=os.environ.get(ASYNC_PROGRESS))
    elif cfg["part"] == "topk_time":  # the experiment of lab 10's section 9
        out.update(compression.time_to_accuracy(comm, cfg["samples"], cfg["epochs"]))
    else:
        for name in ("dense", "topk1"):
            params = mlp.init_params([784, 100, 10], seed=0, init="he")
            ar = "ring" if name == "dense" else compression.CompressedAllreduce("topk", ratio=0.01)
            h = mlp.train(params, (x, y), epochs=cfg["epochs"], batch_size=64, lr=0.05, momentum=0.9,
                          activation="relu", cost="cross_entropy", method=DataParallel(comm, allreduce=ar),
                          test_data=(xt, yt), progress=False)
            out[f"{name}_accuracy"] = h.final_accuracy
            if name == "topk1":
                out["bytes_ratio"] = ar.compression_ratio
    if comm.Get_rank() == 0:
        print(json.dumps(out), flush=True)


def _overlap_steps(comm, cfg: dict) -> dict:
    """Blocking and overlapped data-parallel steps of :data:`OVERLAP_NETWORK`, alternating in ``rounds`` rounds of
    ``steps`` steps each; per-step medians, and the blocking step's compute / allreduce split."""
    from mpi4py import MPI

    rng = np.random.default_rng(0)
    batch = cfg["batch"]
    x = rng.random((batch, OVERLAP_NETWORK[0]), dtype=np.float32)
    Y = mlp.targets(rng.integers(0, 10, batch), 10, np.float32)
    params = mlp.init_params(OVERLAP_NETWORK, seed=0, init="he")
    methods = {"blocking": DataParallel(comm, allreduce="mpi", timeout=300),
               "overlap": DataParallel(comm, allreduce="mpi", overlap=True, bucket_bytes=cfg["bucket_bytes"],
                                       progress=cfg["progress"], timeout=300),
               "overlap_thread": DataParallel(comm, allreduce="mpi", overlap=True, bucket_bytes=cfg["bucket_bytes"],
                                              progress="thread", timeout=300)}
    per_step = {k: [] for k in methods}
    split = {k: [] for k in methods}
    names = list(methods)
    for r in range(cfg["rounds"] + 1):  # round 0 warms up (buffers, connections)
        for name in names[r % len(names):] + names[:r % len(names)]:
            dp = methods[name]
            c0, m0 = dp.compute_seconds, dp.comm_seconds
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(cfg["steps"]):
                dp(params, x, Y, "relu", "cross_entropy")
            comm.Barrier()
            t = comm.allreduce((MPI.Wtime() - t0) / cfg["steps"], op=MPI.MAX)
            if r:
                per_step[name].append(t)
                split[name].append(((dp.compute_seconds - c0) / cfg["steps"], (dp.comm_seconds - m0) / cfg["steps"]))
    med = {k: float(np.median(v)) for k, v in per_step.items()}
    backprop, wait = ({k: float(np.median([s[i] for s in v])) for k, v in split.items()} for i in (0, 1))
    compute, allreduce = backprop["blocking"], wait["blocking"]
    # backprop_seconds: a rank's backprop per step, longer where the allreduces in flight take its core;
    # wait_seconds: the allreduce (blocking) or what of it was left after backprop (overlapped)
    return {"step_seconds": med, "per_round": per_step, "backprop_seconds": backprop, "wait_seconds": wait,
            "blocking_compute_seconds": compute, "blocking_allreduce_seconds": allreduce,
            "allreduce_share": allreduce / (compute + allreduce)}


def _no_exchange(comm, x, op):
    """An "allreduce" that sends nothing: each rank keeps its own shard's gradient."""
    return x


def _job(cluster, cfg: dict, n: int, hosts=None, env: dict | None = None) -> dict:
    res = cluster.run_mpi(["-m", "labkit.benchmarks.training", json.dumps(cfg)], n=n, timeout=1800, hosts=hosts, env=env)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"the {n}-rank training job failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(lines[-1])


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None, hosts: int = 0,
        link: str | None = None, hosts_only: bool = False) -> dict:
    """Run the jobs one after another (they must not share the cores) and collect the figures.

    The timed data-parallel jobs run in ``rounds`` interleaved rounds (3, or 1 with ``quick``): a slow spell of a
    shared machine then hits every configuration alike, and each one's run with the median time is reported.
    ``hosts`` (and ``link``): see the module's docstring; ``hosts_only=True`` measures only those figures.
    """
    rounds = (1 if quick else 3) if rounds is None else rounds
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if (link is not None or hosts_only) and hosts < 2:
        raise ValueError("the figures of a costly network need hosts=2 or more (namespace hosts, root)")
    if hosts_only:
        result = {"benchmark": "training", "quick": quick, "machine": machine_info(),
                  "when": time.strftime("%Y-%m-%d %H:%M:%S"), "targets_met": {}}
    else:
        result = _one_machine(quick, progress, rounds)
    if hosts > 1:
        result.update(_across_hosts(quick, progress, rounds, hosts, link))
        targets = hosts_targets(hosts)
        result["targets_met"].update({k: (v[0] <= result[k] <= v[1] if op == "within" else result[k] <= v)
                                      for k, (op, v) in targets.items() if result.get(k) is not None})
    return result


def _across_hosts(quick: bool, progress, rounds: int, hosts: int, link: str | None) -> dict:
    """The figures of a network that costs: one rank on each of ``hosts`` namespace hosts, cables at ``link``."""

    out: dict = {"hosts": {"n": hosts, "link": link}}
    with namespace_hosts(hosts, link=link) as made, \
            progress_bar(total=4, enable=progress, desc="training across hosts", unit="job") as bar:
        rate = measure_link_rate(made, repeat=3)
        out["hosts"]["link_rate"] = rate
        out["link_rate_measured_vs_set"] = rate["ratio"]
        bar.update(1)
        ov_cfg = {"part": "overlap", "samples": 0, "batch": overlap_batch(made.link_bits_per_second),
                  "bucket_bytes": 1 << 20, "progress": "layers", "steps": 3 if quick else 5, "rounds": 2 * rounds + 1}
        ov = _job(cluster, ov_cfg, hosts, hosts=made)
        out["overlap"] = {"network": OVERLAP_NETWORK, **{k: v for k, v in ov_cfg.items() if k not in ("part", "samples")},
                          **{k: v for k, v in ov.items() if k not in ("p", "samples")}}
        out[f"overlap_step_vs_blocking_hosts{hosts}"] = ov["step_seconds"]["overlap_thread"] / ov["step_seconds"]["blocking"]
        out["overlap"]["layers_step_vs_blocking"] = ov["step_seconds"]["overlap"] / ov["step_seconds"]["blocking"]
        bar.update(1)
        # the same steps with MPICH's own progress thread: does a non-blocking allreduce then move without Test calls?
        asy = _job(cluster, {**ov_cfg, "progress": "none"}, hosts, hosts=made, env={ASYNC_PROGRESS: "1"})
        out["overlap"]["mpich_async_progress"] = {
            "set": asy.get("async_progress"), "step_seconds": asy["step_seconds"],
            "none_step_vs_blocking": asy["step_seconds"]["overlap"] / asy["step_seconds"]["blocking"],
            "thread_step_vs_blocking": asy["step_seconds"]["overlap_thread"] / asy["step_seconds"]["blocking"]}
        bar.update(1)
        tt_cfg = {"part": "topk_time", "samples": 20000 if quick else 60000, "epochs": 2 if quick else 3}
        tt = _job(cluster, tt_cfg, hosts, hosts=made)
        out["topk_time"] = {"network": [784, 100, 10], "batch": 64, **tt_cfg, "dense": tt["dense"],
                            "topk1": tt["topk"], "target_accuracy": tt["target"],
                            "topk1_seconds_to_target": tt["topk_seconds"]}
        out[f"topk_time_to_accuracy_vs_dense_hosts{hosts}"] = tt["share"]
        bar.update(1)
    return out


def _one_machine(quick: bool, progress, rounds: int) -> dict:
    """The figures on this machine (the module's first three)."""
    dp_cfg = {"part": "dp", "samples": 20000 if quick else 60000, "epochs": 1 if quick else 2}
    tk_cfg = {"part": "topk", "samples": 60000, "epochs": 2 if quick else 5}
    as_cfg = {"part": "async", "samples": 60000, "epochs": 2 if quick else 5}
    timed = [("serial", dp_cfg, 1), ("dp2", {**dp_cfg, "allreduce": "shm", "shard_update": True}, 2),
             ("dp2_unsharded", {**dp_cfg, "allreduce": "shm"}, 2), ("dp2_ring", dp_cfg, 2),
             ("dp2_none", {**dp_cfg, "allreduce": "none"}, 2), ("dp2_independent", {**dp_cfg, "independent": True}, 2)]
    jobs = timed * rounds + [("topk", tk_cfg, 2), ("async", as_cfg, 6)]
    runs: dict[str, list[dict]] = {}
    for name, cfg, n in progress_bar(jobs, enable=progress, desc="training bench"):
        runs.setdefault(name, []).append(_job(cluster, cfg, n))
    got = {name: rs[0] if len(rs) == 1 else sorted(rs, key=lambda r: r["seconds"])[(len(rs) - 1) // 2]
           for name, rs in runs.items()}  # each timed configuration's median run
    serial, dp2, ring, tk, asy = got["serial"], got["dp2"], got["dp2_ring"], got["topk"], got["async"]
    uns = got["dp2_unsharded"]
    result = {
        "benchmark": "training", "quick": quick, "data": locate().describe(),
        "dp": {"network": [784, 256, 10], "batch": 128, **dp_cfg, "samples": serial["samples"],
               "serial_seconds": serial["seconds"],
               "p2_seconds": dp2["seconds"], "serial_accuracy": serial["accuracy"], "p2_accuracy": dp2["accuracy"],
               "p2_compute_seconds": dp2["compute_seconds"], "p2_comm_seconds": dp2["comm_seconds"],
               "p2_unsharded_seconds": uns["seconds"], "p2_unsharded_accuracy": uns["accuracy"],
               "p2_ring_seconds": ring["seconds"], "p2_ring_accuracy": ring["accuracy"],
               "p2_ring_compute_seconds": ring["compute_seconds"], "p2_ring_comm_seconds": ring["comm_seconds"],
               "rounds": rounds, "seconds_per_round": {name: [r["seconds"] for r in runs[name]] for name, _, _ in timed}},
        "dp_speedup_p2": serial["seconds"] / dp2["seconds"],
        "dp_speedup_p2_unsharded": serial["seconds"] / uns["seconds"],
        "dp_speedup_p2_ring": serial["seconds"] / ring["seconds"],
        "dp_speedup_p2_no_exchange": serial["seconds"] / got["dp2_none"]["seconds"],
        "dp_speedup_p2_independent": serial["seconds"] / got["dp2_independent"]["seconds"],
        "topk": {"network": [784, 100, 10], "batch": 64, "ranks": 2, **tk_cfg, "samples": tk["samples"],
                 "dense_accuracy": tk["dense_accuracy"],
                 "topk1_accuracy": tk["topk1_accuracy"], "bytes_ratio": tk["bytes_ratio"]},
        "topk1_accuracy_gap": tk["dense_accuracy"] - tk["topk1_accuracy"],
        "async": {"network": [784, 100, 10], "batch": 32, "lr": 0.05, "workers": 4, "masters": 2, **as_cfg,
                  **{k: v for k, v in asy.items() if k not in ("p", "accuracy")}},
        "async_accuracy_w4_m2": asy["accuracy"],
        "machine": machine_info(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    result["targets_met"] = {k: (result[k] >= b if op == ">=" else result[k] <= b) for k, (op, b) in TARGETS.items()}
    return result


def report(result: dict) -> str:
    """A summary for people."""
    if "dp" not in result:  # hosts_only
        return "\n".join([f"training benchmark ({'quick' if result['quick'] else 'full'}), across hosts only",
                          *report_hosts(result)])
    d, t = result["dp"], result["topk"]
    lines = [
        f"training benchmark ({'quick' if result['quick'] else 'full'}); data: {result['data']}",
        f"data parallel [784,256,10], batch 128, {d['epochs']} epoch(s) of {d['samples']} samples, 1 BLAS thread/process, "
        f"median of {d['rounds']} interleaved round(s):",
        f"  serial {d['serial_seconds']:.2f} s (acc {d['serial_accuracy']:.2%})",
        f"  2 ranks, shared memory, sharded update {d['p2_seconds']:.2f} s (acc {d['p2_accuracy']:.2%}; compute "
        f"{d['p2_compute_seconds']:.2f} s, waiting {d['p2_comm_seconds']:.2f} s): {result['dp_speedup_p2']:.2f}x",
        f"  2 ranks, shared-memory allreduce, whole update on each rank {d['p2_unsharded_seconds']:.2f} s "
        f"(acc {d['p2_unsharded_accuracy']:.2%}): {result['dp_speedup_p2_unsharded']:.2f}x",
        f"  2 ranks, ring allreduce {d['p2_ring_seconds']:.2f} s (acc {d['p2_ring_accuracy']:.2%}; compute "
        f"{d['p2_ring_compute_seconds']:.2f} s, allreduce {d['p2_ring_comm_seconds']:.2f} s): "
        f"{result['dp_speedup_p2_ring']:.2f}x",
        f"  bound for the unsharded design, the gradient exchange free: 2 ranks sending no gradient, each applying "
        f"the whole update of its own half batch {result['dp_speedup_p2_no_exchange']:.2f}x",
        f"  what 2 processes on this machine reach with no communication and no shared state at all (each trains alone "
        f"on half the samples, half-size batches, same steps): {result['dp_speedup_p2_independent']:.2f}x",
        f"top-k 1 % + error feedback, [784,100,10], 2 ranks, {t['epochs']} epoch(s): dense {t['dense_accuracy']:.2%}, "
        f"top-k {t['topk1_accuracy']:.2%}, bytes {t['bytes_ratio']:.1%} of dense",
        f"asynchronous parameter server, 4 workers, 2 masters, {result['async']['epochs']} epoch(s): "
        f"{result['async_accuracy_w4_m2']:.2%}, staleness mean {result['async']['staleness_mean']:.1f} "
        f"(max {result['async']['staleness_max']}), updates per master {result['async']['master_updates']}", "",
    ]
    for k, (op, bound) in TARGETS.items():
        lines.append(f"{k} = {result[k]:.3f}  (target {op} {bound:g}: {'met' if result['targets_met'][k] else 'NOT met'})")
    return "\n".join(lines + ["", *report_hosts(result)])


def report_hosts(result: dict) -> list[str]:
    """The lines of the figures measured across hosts (none where they were not)."""
    if "hosts" not in result:
        return []
    h, ov, tt = result["hosts"], result["overlap"], result["topk_time"]
    n, rate = h["n"], h["link_rate"]
    s = ov["step_seconds"]
    lines = [f"across {n} namespace hosts, one rank each, cables {h['link'] or 'unshaped'}: a ping-pong got "
             f"{rate['bits_per_second'] / 1e6:.0f} Mbit/s",
             f"  step of {ov['network']} at batch {ov['batch']}: blocking {s['blocking'] * 1e3:.1f} ms (backprop "
             f"{ov['blocking_compute_seconds'] * 1e3:.1f} ms, allreduce {ov['blocking_allreduce_seconds'] * 1e3:.1f} ms, "
             f"{ov['allreduce_share']:.0%} of it), overlapped {s['overlap_thread'] * 1e3:.1f} ms (a progress thread, "
             f"as DDP does), {s['overlap'] * 1e3:.1f} ms (only a test after every layer); backprop alone took "
             + ", ".join(f"{ov['backprop_seconds'][k] * 1e3:.0f} ms ({k})" for k in ov["backprop_seconds"]),
             f"  with MPICH's progress thread ({ASYNC_PROGRESS}=1): overlapped with no test at all "
             f"{ov['mpich_async_progress']['none_step_vs_blocking']:.2f} of blocking, with labkit's thread "
             f"{ov['mpich_async_progress']['thread_step_vs_blocking']:.2f}" if "mpich_async_progress" in ov else "",
             f"  top-k 1 % + error feedback against dense, [784,100,10] batch 64: dense {tt['dense']['seconds'][-1]:.1f} s "
             f"to {tt['target_accuracy']:.2%}; top-k "
             + (f"{tt['topk1_seconds_to_target']:.1f} s to the same accuracy" if tt["topk1_seconds_to_target"]
                else f"never reached it in {len(tt['topk1']['seconds'])} epochs ({tt['topk1']['accuracy'][-1]:.2%})"), ""]
    for k, (op, bound) in hosts_targets(n).items():
        if result.get(k) is None:
            continue
        shown = f"{bound[0]:g}-{bound[1]:g}" if op == "within" else f"{bound:g}"
        lines.append(f"{k} = {result[k]:.3f}  (target {op} {shown}: {'met' if result['targets_met'][k] else 'NOT met'})")
    return lines


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
