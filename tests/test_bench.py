import numpy as np
import pytest
from conftest import ranks
from mpicases import mpi_cases

from labkit import bench, runner, scaling


def test_amdahl_fit_recovers_serial_fraction():
    p = np.array([1, 2, 4, 8, 16])
    for f in (0.0, 0.05, 0.3):
        assert bench.fit_amdahl(p, bench.amdahl(p, f)) == pytest.approx(f, abs=1e-12)
        np.testing.assert_allclose(bench.karp_flatt(p[1:], bench.amdahl(p[1:], f)), f, atol=1e-12)
    with pytest.raises(ValueError, match="more than one worker"):
        bench.fit_amdahl([1], [1.0])


def test_laws_at_limits():
    assert bench.amdahl(1, 0.3) == pytest.approx(1.0)
    assert bench.amdahl(1e9, 0.25) == pytest.approx(4.0, rel=1e-6)
    assert bench.gustafson(8, 0.0) == pytest.approx(8.0)
    assert bench.gustafson(8, 1.0) == pytest.approx(1.0)
    np.testing.assert_allclose(bench.efficiency(bench.speedup(8.0, [8.0, 4.0, 2.5]), [1, 2, 4]), [1, 1, 0.8])


def test_measure_and_format():
    calls = []
    t = bench.measure(lambda: calls.append(1), repeat=4, warmup=2)
    assert len(calls) == 6 and len(t.times) == 4 and t.best <= t.median and t.spread >= 0
    assert bench.format_seconds(2.5) == "2.50 s" and bench.format_seconds(0.0032) == "3.2 ms"
    assert bench.format_seconds(4.1e-5) == "41 µs"
    info = bench.machine_info()
    assert info["cpus"] >= 1 and "numpy" in info


def test_gustafson_fit_recovers_serial_fraction():
    p = np.array([1, 2, 4, 8])
    for f in (0.0, 0.1, 0.5):
        assert bench.fit_gustafson(p, bench.gustafson(p, f)) == pytest.approx(f, abs=1e-12)
    with pytest.raises(ValueError, match="more than one worker"):
        bench.fit_gustafson([1, 1], [1.0, 1.0])


def test_wall_and_cpu_clocks_tell_waiting_from_working():
    import time

    wall = bench.measure(lambda: time.sleep(0.05), repeat=2, warmup=0, clock="wall")
    cpu = bench.measure(lambda: time.sleep(0.05), repeat=2, warmup=0, clock="cpu")
    assert wall.best >= 0.05 and cpu.median < 0.03  # sleeping takes time but no CPU
    with bench.timer("cpu") as t:
        sum(i * i for i in range(200_000))
    assert t.seconds > 0
    with pytest.raises(ValueError, match="clock must be one of"):
        bench.measure(lambda: None, clock="sundial")
    with pytest.raises(ValueError, match="repeat >= 1"):
        bench.measure(lambda: None, repeat=0)


@pytest.mark.gpu
def test_cuda_clock_needs_a_gpu_or_times_the_gpu():
    from labkit import device

    if not device.gpu_status()[0]:
        with pytest.raises(RuntimeError, match="clock='cuda' needs CuPy and a CUDA GPU"):
            bench.measure(lambda: None, clock="cuda")
        return
    import cupy

    a = cupy.random.random((1024, 1024), dtype=cupy.float32)
    t = bench.measure(lambda: a @ a, repeat=3, clock="cuda")
    assert 0 < t.median < 1.0


def _timings(medians):
    return [bench.Timing([m, m * 1.01, m * 0.99]) for m in medians]


def test_scaling_strong_and_weak_figures():
    f, ranks = 0.2, [1, 2, 4]
    t1 = 10.0
    strong = scaling.Scaling("w", "strong", 100, ranks, _timings([t1 / float(bench.amdahl(p, f)) for p in ranks]), cores=2)
    np.testing.assert_allclose(strong.speedup, bench.amdahl(ranks, f))
    np.testing.assert_allclose(strong.efficiency, bench.amdahl(ranks, f) / ranks)
    assert strong.serial_fraction == pytest.approx(f)
    assert np.isnan(strong.karp_flatt[0]) and strong.karp_flatt[1:] == pytest.approx([f, f])
    table = strong.table()
    assert "Karp-Flatt" in table and "more ranks than cores" in table
    assert "Amdahl's law on 1-2 ranks (within the 2 cores): 0.200" in table and strong.fitted_ranks == [1, 2]
    # more ranks than cores take turns: their slowdown is not read as serial work
    crowded = scaling.Scaling("w", "strong", 100, ranks, _timings([t1, t1 / float(bench.amdahl(2, f)), t1]), cores=2)
    assert crowded.serial_fraction == pytest.approx(f)
    crowded.cores = None
    assert crowded.fitted_ranks == ranks and crowded.serial_fraction > 0.5
    # weak: every p-rank run takes t1; one rank needs (f + p (1 - f)) t1 for the same scaled problem
    weak = scaling.Scaling("w", "weak", 100, ranks, _timings([t1] * 3),
                         serial_timings=_timings([t1 * (f + p * (1 - f)) for p in ranks]))
    np.testing.assert_allclose(weak.speedup, bench.gustafson(ranks, f))
    np.testing.assert_allclose(weak.weak_efficiency, 1.0)
    assert weak.serial_fraction == pytest.approx(f) and np.isnan(weak.karp_flatt).all()
    assert "Gustafson's law: 0.200" in weak.table() and weak.to_dict()["mode"] == "weak"
    estimated = scaling.Scaling("w", "weak", 100, ranks, _timings([t1, 2 * t1, 2 * t1]))  # without one-rank runs
    np.testing.assert_allclose(estimated.speedup, [1, 1, 2])  # p T1 / Tp
    with pytest.raises(ValueError, match="1-rank baseline"):
        scaling.Scaling("w", "strong", 1, [2, 4], _timings([1, 1]))
    with pytest.raises(ValueError, match="'strong' or 'weak'"):
        scaling.Scaling("w", "diagonal", 1, [1], _timings([1]))


def test_timeline_and_chrome_trace(tmp_path):
    import json
    import time

    tl = bench.Timeline(rank=3)
    with tl.phase("backprop"):
        time.sleep(0.01)
    with tl.phase("allreduce", "comm"):
        pass
    assert [e["name"] for e in tl.events] == ["backprop", "allreduce"]
    assert tl.events[0]["end"] - tl.events[0]["start"] >= 0.01
    assert tl.totals()["compute"] >= 0.01 and "comm" in tl.totals()
    doc = bench.chrome_trace(tl.events, tmp_path / "trace.json", process="test")
    assert json.loads((tmp_path / "trace.json").read_text()) == doc
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["tid"] for e in xs] == [3, 3] and xs[0]["dur"] >= 1e4  # microseconds
    assert {"name": "thread_name", "ph": "M", "pid": 0, "tid": 3, "args": {"name": "rank 3"}} in doc["traceEvents"]
    with pytest.raises(ValueError, match="ends before it starts"):
        bench.chrome_trace([{"rank": 0, "name": "x", "start": 1.0, "end": 0.5}])


test_mpi_clock_and_timeline_under_mpiexec = mpi_cases("cases_bench.py", ranks(2, 3))


@pytest.mark.mpi
def test_strong_and_weak_scaling_runners():
    strong = scaling.strong_scaling("synthetic", ranks=(2,), size=40, repeat=2, trace=True, progress=False)
    assert strong.ranks == [1, 2] and len(strong.timings) == 2 and all(len(t.times) == 2 for t in strong.timings)
    assert np.isfinite(strong.serial_fraction) and (strong.times > 0).all()
    assert {e["rank"] for e in strong.traces[2]} == {0, 1} and set(strong.phases[1]) == {"compute", "comm"}
    # rank 0 alone does the serial part while rank 1 waits at the barrier: the waiting is counted in the phases, and
    # the transfer is the least time at the barrier of each step; by construction (a least time against a median of
    # longest ones, a step's part against its whole) never more, whatever the machine's load
    assert [len(t.times) for t in strong.transfers] == [0, 2] and strong.transfer_share[0] == 0
    assert strong.transfers[1].best <= strong.phases[1]["comm"] and 0 < strong.transfer_share[1] <= 1
    weak = scaling.weak_scaling("backprop", ranks=(1, 2), size=64, repeat=2, progress=False)
    assert weak.mode == "weak" and weak.speedup[0] == pytest.approx(1.0) and weak.phases[1]["comm"] > 0
    assert len(weak.serial_timings) == 2 and weak.serial_timings[0] is weak.timings[0]
    assert weak.speedup[1] == pytest.approx(weak.serial_timings[1].median / weak.timings[1].median)
    assert len(weak.transfers[1].times) == 2 and 0 < weak.transfer_share[1] <= 1


@pytest.mark.mpi
def test_scaling_runner_errors():
    with pytest.raises(ValueError, match="unknown workload 'sorting'"):
        scaling.strong_scaling("sorting")
    with pytest.raises(ValueError, match="positive rank counts"):
        scaling.strong_scaling("synthetic", ranks=(0, 2))
    with pytest.raises(RuntimeError, match=r"failed \(exit 1\)[\s\S]*serial must be in \[0, 1\]"):
        scaling.launch("synthetic", "strong", 1, size=10, serial=2.0)
    with pytest.raises(RuntimeError, match="did not finish in 2 s"):
        scaling.launch("synthetic", "strong", 1, size=10**7, repeat=1, timeout=2)


def test_scaling_options_are_checked():
    with pytest.raises(ValueError, match="takes no option serial"):
        scaling.strong_scaling("backprop", options={"serial": 0.2})


def test_scaling_survives_json():
    import json

    weak = scaling.Scaling("w", "weak", 8, [1, 2], _timings([1.0, 1.1]), phases=[{"comm": 0.0}, {"comm": 0.1}], cores=2,
                         serial_timings=_timings([1.0, 1.9]), transfers=_timings([0.0, 0.05]))
    back = scaling.Scaling.from_dict(json.loads(json.dumps(weak.to_dict())))
    assert back.to_dict() == weak.to_dict() and back.table() == weak.table()
    assert back.transfer_share.tolist() == pytest.approx([0.0, 0.05 / 1.1])
    old = {k: v for k, v in weak.to_dict().items() if k != "transfers"}  # saved before transfers were measured
    with pytest.raises(ValueError, match="no transfer times"):
        _ = scaling.Scaling.from_dict(old).transfer_share


def test_measure_syncs_inside_the_timing():
    calls = []
    t = bench.measure(lambda: calls.append("run"), repeat=2, warmup=1, sync=lambda: calls.append("sync"))
    assert calls == ["run", "sync", "run", "sync", "run", "sync"] and len(t.times) == 2


def test_interleaved_rotates_the_order_and_keeps_every_round():
    order = []

    def job(name, seconds):
        return lambda: (order.append(name), seconds)[1]

    got = bench.interleaved({"a": job("a", 1.0), "b": job("b", 2.0), "c": job("c", 3.0)}, rounds=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each job goes first once
    assert got["b"].times == [2.0, 2.0, 2.0] and got["c"].median == 3.0
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench.interleaved({"a": job("a", 1.0)}, rounds=0)


def test_merge_rounds_takes_medians_and_keeps_rounds():
    merged = bench.merge_rounds([{"x": 1.0, "rows": [1], "ok": True}, {"x": 5.0, "rows": [2], "ok": True},
                                 {"x": 2.0, "rows": [3], "ok": False}])
    assert merged["x"] == 2.0 and merged["rounds"]["x"] == [1.0, 5.0, 2.0]
    assert merged["rows"] == [3] and merged["ok"] is False  # not numbers: the last round's
    with pytest.raises(ValueError):
        bench.merge_rounds([])


@pytest.mark.mpi
def test_scaling_rounds_pool_every_round():
    s = scaling.strong_scaling("synthetic", ranks=(2,), size=40, repeat=2, rounds=2, progress=False)
    assert [len(t.times) for t in s.timings] == [4, 4] and s.phases[1]["comm"] >= 0
    assert [len(t.times) for t in s.transfers] == [0, 4]  # every round's timed steps
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        scaling.strong_scaling("synthetic", ranks=(2,), size=40, rounds=0)


def test_the_classroom_benchmark_hands_in_what_each_kind_of_student_would():
    from labkit.benchmarks import classroom

    lab = runner.find_notebooks(only="01_")[0]
    kinds = [classroom.kind_of(i, 40) for i in range(40)]
    assert kinds.count("endless") == 2 and kinds.count("blank") == 8 and kinds.count("wrong") == 10
    wrong = "\n".join(c.source for c in classroom.submission(lab, "wrong").cells)
    endless = "\n".join(c.source for c in classroom.submission(lab, "endless").cells)
    blank = "\n".join(c.source for c in classroom.submission(lab, "blank").cells)
    assert "return None" in wrong and "while True:\n        pass" in endless and "raise NotImplementedError" in blank
    assert "### BEGIN SOLUTION" not in wrong + endless + blank
