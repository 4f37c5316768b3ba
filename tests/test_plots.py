"""The figures: they draw what they are given, and refuse what they cannot draw."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from labkit import plots, scaling  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_stacked_bars_stack_the_parts_and_write_the_totals():
    fig = plots.plot_stacked_bars(["a", "b"], {"compute": [1.0, 3.0], "copy": [1.0, 1.0]}, unit="ms")
    ax = fig.axes[0]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [1.0, 1.0, 1.0, 3.0]
    texts = [t.get_text() for t in ax.texts]
    assert " 2 ms" in texts and " 4 ms" in texts
    fig = plots.plot_stacked_bars(["a", "b"], {"compute": [1.0, 3.0], "copy": [1.0, 1.0]}, normalise=True)
    lefts = [p.get_x() + p.get_width() for p in fig.axes[0].patches]
    assert max(lefts) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="one value per label"):
        plots.plot_stacked_bars(["a", "b"], {"compute": [1.0]})
    with pytest.raises(ValueError, match=">= 0"):
        plots.plot_stacked_bars(["a"], {"compute": [-1.0]})


def test_roofline_draws_the_ceilings_and_every_point():
    fig = plots.plot_roofline({"matmul": (30.0, 500.0), "copy": (0.125, 10.0)}, peak_gflops=1000.0, bandwidth_gbs=100.0)
    ax = fig.axes[0]
    x, y = ax.lines[0].get_data()
    assert np.allclose(y, np.minimum(1000.0, 100.0 * x))  # the roof: min(peak, intensity x bandwidth)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["matmul: 500 GFLOP/s", "copy: 10 GFLOP/s"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    with pytest.raises(ValueError, match="positive"):
        plots.plot_roofline({"k": (1.0, 1.0)}, peak_gflops=0.0, bandwidth_gbs=1.0)


def test_lines_and_bars_label_their_axes():
    fig = plots.plot_lines([1, 2, 4], {"threads": [1, 1.8, 3.1]}, "workers", "speedup", hline=1)
    assert fig.axes[0].get_xlabel() == "workers" and fig.axes[0].get_ylabel() == "speedup"
    fig = plots.plot_times({"a": 2.0, "b": 1.0}, unit="ms", baseline="a")
    assert any("(2.0x)" in t.get_text() for t in fig.axes[0].texts)


def _scaling(mode, f=0.2):
    from labkit import bench

    ranks = [1, 2, 4]
    law = bench.amdahl if mode == "strong" else bench.gustafson
    if mode == "strong":
        return scaling.Scaling("backprop", mode, 64, ranks, [bench.Timing([8.0 / float(law(p, f))]) for p in ranks], cores=2)
    return scaling.Scaling("backprop", mode, 64, ranks, [bench.Timing([8.0])] * 3, cores=2,
                         serial_timings=[bench.Timing([8.0 * float(law(p, f))]) for p in ranks])


def test_scaling_figure_has_speedup_with_its_law_and_efficiency():
    fig = plots.plot_scaling(_scaling("strong"))
    a1, a2 = fig.axes
    labels = [ln.get_label() for ln in a1.lines]
    assert "Amdahl fit, serial fraction 0.20" in labels and "ideal (S = p)" in labels
    measured = [ln for ln in a1.lines if ln.get_label().startswith("backprop")][0]
    assert np.allclose(measured.get_ydata(), _scaling("strong").speedup)
    eff = [ln for ln in a2.lines if ln.get_label().startswith("backprop")][0]
    assert np.allclose(eff.get_ydata(), 100 * _scaling("strong").efficiency)  # in percent
    assert "efficiency" in a2.get_ylabel() and any(ln.get_label() == "2 cores" for ln in a2.lines)
    fig = plots.plot_scaling(_scaling("weak"))
    assert "Gustafson fit, serial fraction 0.20" in [ln.get_label() for ln in fig.axes[0].lines]
    with pytest.raises(ValueError, match="separately"):
        plots.plot_scaling(_scaling("strong"), _scaling("weak"))
    with pytest.raises(ValueError, match="at least one"):
        plots.plot_scaling()


def test_rank_timeline_one_lane_per_rank():
    events = [{"rank": r, "name": n, "kind": k, "start": s, "end": e}
              for r in (0, 1) for n, k, s, e in (("backprop", "compute", 0.0, 0.004), ("allreduce", "comm", 0.004, 0.005))]
    fig = plots.plot_rank_timeline(events, colour_by="kind")
    ax = fig.axes[0]
    assert len(ax.patches) == 4 and [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert sorted(round(p.get_width(), 6) for p in ax.patches) == [1.0, 1.0, 4.0, 4.0]  # milliseconds
    assert ax.get_xlabel() == "time (ms)"
    with pytest.raises(ValueError, match="no events"):
        plots.plot_rank_timeline([])
    # overlap: an allreduce in flight during backprop gets a lane of its own beside the compute
    events.append({"rank": 1, "name": "bucket 0", "kind": "comm (in flight)", "start": 0.001, "end": 0.003})
    ax = plots.plot_rank_timeline(events, lane_per_kind=True).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0: compute", "rank 0: comm", "rank 1: compute",
                                                            "rank 1: comm", "rank 1: comm (in flight)"]
    assert len(ax.patches) == 5


def test_figures_keep_every_series_visible_and_ticks_whole():
    """Review findings: a measurement equal to its formula stays visible on it, the ideal line stays above a fit
    that runs along it, staleness has whole-number ticks, legends and labels sit beside the data."""
    fig = plots.plot_lines([2, 3, 4], {"ring (measured)": [1, 2, 3]}, "p", "MB", formulas={"ring (formula)": [1, 2, 3]})
    measured, formula = fig.axes[0].lines[:2]
    assert measured.get_marker() == "o" and measured.get_linestyle() == "None" and formula.get_linestyle() == "--"
    assert measured.get_zorder() > formula.get_zorder() and measured.get_color() == formula.get_color()
    fig = plots.plot_staleness({"sync": [0, 0, 0]})
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0"]
    fig = plots.plot_speedup([1, 2, 4], {"x": [1, 2, 3.9]}, amdahl_f=0.001, cores=2)
    ideal = next(ln for ln in fig.axes[0].lines if ln.get_label().startswith("ideal"))
    fit = next(ln for ln in fig.axes[0].lines if ln.get_label().startswith("Amdahl"))
    assert ideal.get_zorder() > fit.get_zorder() and not fig.axes[0].texts  # "2 cores" is in the legend
    fig = plots.plot_tradeoff({"dense": (100, 93.0), "int8": (25, 93.1)}, "bytes", "accuracy", logx=True)
    assert not fig.axes[0].texts and fig.axes[0].get_legend() is not None


def test_curves_keep_each_runs_own_x_values():
    fig = plots.plot_curves({"dense": ([1.0, 2.0], [0.9, 0.93]), "top-k": ([0.3, 0.6, 0.9], [0.85, 0.92, 0.94])},
                            "s", "accuracy", hline=0.93, hline_label="dense's final accuracy")
    dense, topk, level = fig.axes[0].lines
    assert list(dense.get_xdata()) == [1.0, 2.0] and list(topk.get_xdata()) == [0.3, 0.6, 0.9]
    assert level.get_linestyle() == "--" and "dense's final accuracy" in [t.get_text() for t in fig.axes[0].get_legend().texts]
