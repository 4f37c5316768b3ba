"""The speed-of-light model: each unit's time on a named GPU from a launch's counts (labkit.kernels.speed_of_light)."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit.kernels import speed_of_light as S
from labkit.kernels.counts import FIELDS, Traffic

H100 = S.GPUS["H100 SXM"]


def launch(**kw) -> S.Counts:
    base = dict(kernel="k", load_requests=0, load_sectors=0, store_requests=0, store_sectors=0, shared_requests=0,
                shared_wavefronts=0, flops=0.0)
    return S.Counts(**{**base, **kw})


def test_each_unit_against_figures_computed_by_hand():
    # 1,000 load sectors and 24 store sectors: 32,768 bytes through the L2; DRAM moves the 8,192-byte footprint
    c = launch(load_sectors=1000, store_sectors=24, shared_wavefronts=5_280, flops=1.0e6, atomics=300,
               atomics_max_per_address=200, blocks=1000, footprint=8192)
    t = S.model(c, "H100 SXM").times
    assert t["DRAM"] == pytest.approx(8192 / 3.35e12)
    assert t["L2"] == pytest.approx(32768 / (3.35e12 * 5120 * 1.41e9 / 2.039e12))
    assert t["shared memory"] == pytest.approx(5_280 / (132 * 1.98e9))    # one wavefront per clock per SM
    assert t["FP32"] == pytest.approx(1.0e6 / 66.9e12)
    assert t["atomics (one address)"] == pytest.approx(200 / 1.98e9)      # serialised on the busiest address
    sol = S.model(c, "H100 SXM")
    assert sol.unit == "atomics (one address)" and sol.bound == pytest.approx(200 / 1.98e9)


def test_a_grid_smaller_than_the_gpu_uses_only_its_blocks_sms():
    c = launch(shared_wavefronts=4 * 1000, flops=4 * 2.0e6, blocks=4)
    t = S.model(c, "A100 SXM").times
    assert t["shared memory"] == pytest.approx(1000 / 1.41e9)          # 4 SMs, 1,000 wavefronts each
    assert t["FP32"] == pytest.approx(8.0e6 / (19.5e12 * 4 / 108))


def test_without_a_footprint_dram_moves_every_sector():
    c = launch(load_sectors=100, flops=1.0)
    assert S.model(c, "T4").times["DRAM"] == pytest.approx(3200 / 320e9)
    assert S.model(c, "T4").unit == "DRAM"  # with no reuse, DRAM moves as much as the L2 and is slower
    assert c.intensity == pytest.approx(1 / 3200)


def test_the_gpu_table_cites_its_figures_and_selects_by_device_name():
    for g in S.GPUS.values():
        assert "datasheet" in g.sources and "whitepaper" in g.sources
    assert S.gpu_named("NVIDIA H100 80GB HBM3") is S.GPUS["H100 SXM"]
    assert S.gpu_named("NVIDIA A100-SXM4-80GB") is S.GPUS["A100 SXM"]
    assert S.gpu_named("Tesla T4") is S.GPUS["T4"]
    assert S.gpu_named("NVIDIA GeForce RTX 4090") is None
    assert S.gpu("Tesla T4") is S.GPUS["T4"]
    with pytest.raises(KeyError, match="no GPU 'RTX 4090' in the speed-of-light table"):
        S.gpu("RTX 4090")


def test_a_gpu_is_one_record_that_every_place_reads(monkeypatch):
    """The name's pattern, the architecture kernels compile for, shared memory and the rates: one entry each."""
    from dataclasses import replace

    from labkit.kernels import gpus, loader, tools

    assert set(tools.ARCHS) == {g.arch for g in gpus.GPUS.values()} == {"sm_75", "sm_80", "sm_90"}
    assert loader.SHARED_DEVICE_MAX_EMULATED == gpus.GPUS[gpus.DEFAULT].shared_per_block == 227 << 10
    ada = replace(gpus.GPUS["T4"], name="RTX 4090", pattern=r"RTX 4090", arch="sm_89")
    monkeypatch.setitem(gpus.GPUS, "RTX 4090", ada)
    assert S.gpu_named("NVIDIA GeForce RTX 4090") is ada and S.gpu("RTX 4090") is ada
    assert S.model(launch(load_sectors=100, flops=1.0), "RTX 4090").gpu is ada


def test_without_a_gpu_the_default_is_named(monkeypatch):
    monkeypatch.setattr("labkit.kernels.loader.backend", lambda: "emulator")
    g, why = S.in_use()
    assert g is S.GPUS[S.DEFAULT] and "default" in why and S.DEFAULT in why


def _traffic(per_warp: dict, grid=(2, 1, 1)) -> Traffic:
    warps = np.zeros((2, 1, len(FIELDS)), np.uint64)
    for k, v in per_warp.items():
        warps[:, 0, FIELDS.index(k)] = v
    z = np.zeros((1, 1, 2, 1, 1, 32), np.uint32)
    return Traffic("k", grid, (32, 1, 1), z, z, warps)


def test_counted_takes_the_traffic_and_asks_for_what_it_lacks():
    t = _traffic({"load_requests": 3, "load_sectors": 12, "shared_wavefronts": 5})
    c = S.counted(t, flops=10, footprint=64)
    assert (c.load_requests, c.load_sectors, c.shared_wavefronts, c.blocks, c.flops) == (6, 24, 10, 2, 10.0)
    assert "flops" in c.declared
    with pytest.raises(ValueError, match="declare them"):
        S.counted(t)
    with pytest.raises(ValueError, match="atomics_max_per_address"):
        S.counted(t, flops=1, atomics=5)


def test_extrapolate_solves_the_cubic_and_square_terms():
    def at(n):
        return launch(load_sectors=3 * n**3 + 5 * n**2, store_sectors=n**2, shared_wavefronts=n**3, flops=2.0 * n**3)

    got = S.extrapolate(at(4), at(8), 4, 8, 100, flops=2e6, footprint=1, blocks=7)
    want = at(100)
    assert (got.load_sectors, got.store_sectors, got.shared_wavefronts) == \
        (want.load_sectors, want.store_sectors, want.shared_wavefronts)
    assert (got.flops, got.blocks, got.footprint) == (2e6, 7, 1)


@needs_cxx
@pytest.mark.slow
@pytest.mark.parametrize("variant, n", [("naive", 96), ("tiled", 96), ("regblock", 384)])
def test_matmul_counts_grow_as_the_loops_say(variant, n):
    """Counts carried from two sizes equal the counts of a third size, counted."""
    carried, _ = S.matmul_counts(variant, n)
    counted, _, _ = S._matmul_counted(variant, n, None)
    for f in ("load_requests", "load_sectors", "store_requests", "store_sectors", "shared_requests", "shared_wavefronts"):
        assert getattr(carried, f) == getattr(counted, f), f
    assert carried.blocks == counted.blocks


@needs_cxx
@pytest.mark.slow
def test_the_modelled_matmul_ratios_lie_in_the_published_ranges():
    """Published on a real GPU (an A6000 at 4096^3): shared-memory tiles 2,980 GFLOP/s over the coalesced naive
    kernel's 1,987 (1.5x), 2-D register tiles 15,972 over the tiles (5.4x). The model must give 1.2-4 and 2-8."""
    for n in (1024, 2048):
        sol = {v: S.model(S.matmul_counts(v, n)[0], "H100 SXM") for v in ("naive", "tiled", "regblock")}
        assert 1.2 <= sol["naive"].bound / sol["tiled"].bound <= 4, n
        assert 2 <= sol["tiled"].bound / sol["regblock"].bound <= 8, n
        assert sol["naive"].unit == "L2" and sol["tiled"].unit == "shared memory"


@needs_cxx
@pytest.mark.slow
def test_bench_kernels_reports_the_modelled_ratios():
    from labkit.benchmarks import kernels as bench

    r = bench.modelled_part()
    assert [row["kernel"] for row in r["modelled_rows"]] == ["matmul_naive", "matmul_tiled", "matmul_regblock"]
    assert r["modelled_tiled_vs_naive"] == pytest.approx(r["modelled_rows"][0]["seconds"] / r["modelled_rows"][1]["seconds"])
    assert bench._met(r["modelled_tiled_vs_naive"], *bench.TARGETS["modelled_tiled_vs_naive"])
    assert bench._met(r["modelled_regblock_vs_tiled"], *bench.TARGETS["modelled_regblock_vs_tiled"])
    assert not bench._met(9.0, "in", (2.0, 8.0)) and not bench._met(1.1, "in", (1.2, 4.0))


def test_the_plot_outlines_each_kernels_bound():
    import matplotlib.pyplot as plt

    from labkit import plots

    fast = S.model(launch(kernel="a", load_sectors=10, flops=1e9, blocks=200), "H100 SXM")
    slow = S.model(launch(kernel="b", load_sectors=10**9, flops=1.0, blocks=200), "H100 SXM")
    fig = plots.plot_speed_of_light({"compute-bound": fast, "memory-bound": slow})
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sorted(texts) == sorted([f" bound: {slow.bound * 1e6:.3g} µs", f" bound: {fast.bound * 1e6:.3g} µs"])
    assert fast.unit == "FP32" and slow.unit == "DRAM"
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["DRAM", "L2", "FP32"]  # units with no work in any kernel are left out
    outlined = [p for p in fig.axes[0].patches if p.get_linewidth() == 2]
    assert len(outlined) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="no kernels"):
        plots.plot_speed_of_light({})


def test_the_roofline_draws_further_ceilings():
    import matplotlib.pyplot as plt

    from labkit import plots

    fig = plots.plot_roofline({"k": (1.0, 10.0)}, peak_gflops=1000.0, bandwidth_gbs=100.0, more_bandwidths={"L2": 400.0})
    assert len(fig.axes[0].lines) == 1 + 1 + 1 + 1  # DRAM roof, ridge, L2 roof, the point
    assert any("L2: 400 GB/s" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)


@needs_cxx
def test_lab04s_kernel_rate_is_wt_deltas_speed_of_light():
    """W (1000, 784) read once from DRAM bounds it on an H100 SXM: 2 flops per 4 bytes of the launch's arrays."""
    from labkit.kernels.offload import wt_delta_throughput

    footprint = 4 * (1000 * 784 + 1000 + 784)
    assert wt_delta_throughput(784, on="H100 SXM") == pytest.approx(2 * 1000 * 784 / (footprint / 3.35e12))
    # 784 threads are 4 blocks: on an A100 the FP32 units of 4 SMs bound it
    assert wt_delta_throughput(784, on="A100 SXM") == pytest.approx(19.5e12 * 4 / 108)


def _gpu_usable() -> bool:
    from labkit.device import gpu_status

    return gpu_status()[0]


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_usable(), reason="no usable CUDA GPU")
def test_on_a_gpu_no_kernel_beats_its_speed_of_light_by_much():
    """The model is a lower bound: a measured time far under it means a figure of this card's is wrong."""
    from labkit.kernels import measure

    rows = measure.against_model(n=512, n_sum=1 << 22, repeat=5)
    assert {r["kernel"] for r in rows} >= {"naive", "tiled (labkit)", "register-blocked", "every thread atomicAdd"}
    fast = [(r["kernel"], round(r["measured_over_modelled"], 2)) for r in rows if r["measured_over_modelled"] < 0.8]
    assert not fast, f"kernels measured well under their modelled least time on {rows[0]['gpu']}: {fast}"
