"""Figures for the labs: digits, training curves, timings, speedup with its ideal and Amdahl curves.

Every function returns the matplotlib Figure, labels its axes with units, and uses the same
colour for the same method across labs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .bench import amdahl, gustafson
from .device import to_numpy

COLOURS = {
    "per-sample": "#7f7f7f", "per_sample": "#7f7f7f", "serial": "#7f7f7f",
    "vectorised": "#1f77b4", "threads": "#ff7f0e", "processes": "#2ca02c",
    "ideal": "#000000", "amdahl": "#d62728", "gpu": "#9467bd", "mpi": "#8c564b",
    # phases of a parallel step
    "compute": "#1f77b4", "backprop": "#1f77b4", "comm": "#ff7f0e", "allreduce": "#ff7f0e", "wait": "#bbbbbb",
    "update": "#2ca02c",
}
_CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def colour(name: str, i: int = 0) -> str:
    """The colour of a method by name (falling back to the default cycle)."""
    for key, c in COLOURS.items():
        if name.lower().startswith(key):
            return c
    return _CYCLE[i % len(_CYCLE)]


def colours(names) -> list[str]:
    """One colour per series: by method name where that keeps them distinct, else the default cycle."""
    names = list(names)
    by_name = [colour(n, i) for i, n in enumerate(names)]
    return by_name if len(set(by_name)) == len(by_name) else [_CYCLE[i % len(_CYCLE)] for i in range(len(names))]


def _plt():
    import matplotlib.pyplot as plt

    return plt


LabFigure = None  # the class of every figure here, made at first use: importing labkit does not import matplotlib


def _subplots(*args, **kwargs):
    """``pyplot.subplots``, its Figure a :data:`LabFigure`, which a notebook shows once."""
    global LabFigure
    if LabFigure is None:
        from matplotlib.figure import Figure

        class LabFigure(Figure):
            """A Figure that a notebook shows once. pyplot's inline backend shows every figure still open when the
            cell ends, so a plot that was also the cell's value (what every function here returns) came out twice."""

            def _ipython_display_(self):
                """Show the figure, then close it in pyplot so that the end of the cell does not show it again."""
                from IPython.core.pylabtools import print_figure
                from IPython.display import display

                display({"image/png": print_figure(self, "png", base64=True), "text/plain": repr(self)}, raw=True)
                _plt().close(self)

        LabFigure.__qualname__ = "LabFigure"  # pickled by the module's name for it
    return _plt().subplots(*args, FigureClass=LabFigure, **kwargs)


def show_digits(x, labels=None, predicted=None, n: int = 16, cols: int = 8, class_names=None, title: str | None = None):
    """A grid of 28x28 images with their labels; wrong predictions in red as "label→predicted"."""
    x = to_numpy(x)[:n]
    n = len(x)
    rows = max(1, -(-n // cols))
    fig, axes = _subplots(rows, cols, figsize=(cols * 1.1, rows * 1.3), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(x[i].reshape(28, 28), cmap="gray_r", vmin=0, vmax=1)
        def name(k):
            return class_names[int(k)] if class_names else str(int(k))

        if labels is not None:
            text, col = name(labels[i]), "black"
            if predicted is not None and int(predicted[i]) != int(labels[i]):
                text, col = f"{name(labels[i])}→{name(predicted[i])}", "#d62728"
            ax.set_title(text, fontsize=9, color=col)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_history(histories: Mapping[str, object], title: str | None = None):
    """Training loss and test accuracy per epoch for one or more runs (``{name: History}``)."""
    from matplotlib.ticker import MaxNLocator

    fig, (ax1, ax2) = _subplots(1, 2, figsize=(10, 3.8))
    markers = "os^Dv<>p"
    for i, ((name, h), c) in enumerate(zip(histories.items(), colours(histories))):
        style = dict(color=c, marker=markers[i % len(markers)], label=name,
                     ms=8 if len(h.epoch) == 1 else 4, alpha=0.85)
        ax1.plot(h.epoch, h.train_loss, "-", **style)
        if h.test_accuracy:
            ax2.plot(h.epoch, np.asarray(h.test_accuracy) * 100, "-", **style)
    ax1.set(xlabel="epoch", ylabel="training loss (mean per sample)", title="loss (each run's own cost function)")
    ax2.set(xlabel="epoch", ylabel="test accuracy (%)", title="accuracy")
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_times(times: Mapping[str, float], title: str = "time", unit: str = "s", baseline: str | None = None):
    """Horizontal bars of times, each labelled with its value and its speedup over ``baseline``."""
    base = times.get(baseline) if baseline else None
    labels = [f"{v:.3g} {unit}" + (f"  ({base / v:.1f}x)" if base else "") for v in times.values()]
    return plot_bars(times, xlabel=f"{title} ({unit})", labels=labels)


def plot_speedup(p: Sequence[float], speedups: Mapping[str, Sequence[float]], xlabel: str = "workers",
                 ideal: bool = True, amdahl_f: float | None = None, cores: int | None = None, title: str | None = None):
    """Speedup against worker count, with the ideal line, a fitted Amdahl curve and the core count marked
    (:func:`plot_scaling` draws a :class:`labkit.scaling.Scaling` result, Gustafson's curve included)."""
    p = np.asarray(p, dtype=float)
    fig, ax = _subplots(figsize=(6, 4))
    for (name, s), c in zip(speedups.items(), colours(speedups)):
        ax.plot(p, s, "o-", color=c, label=name)
    grid = np.linspace(p.min(), p.max(), 100)
    if ideal:  # on top of a fitted curve that may run along it
        ax.plot(grid, grid, "--", color=COLOURS["ideal"], lw=1, zorder=4, label="ideal (S = p)")
    if amdahl_f is not None and 0 <= amdahl_f <= 1:
        ax.plot(grid, amdahl(grid, amdahl_f), ":", color=COLOURS["amdahl"], lw=2, zorder=1,
                label=f"Amdahl, serial fraction {amdahl_f:.2f}")
    _mark_cores(ax, cores)
    ax.axhline(1, color="grey", lw=0.8, alpha=0.5)
    _integer_ticks(ax, p)
    ax.set(xlabel=xlabel, ylabel="speedup (serial time / parallel time)", title=title or "speedup")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _mark_cores(ax, cores: int | None) -> None:
    """A vertical line at the core count, named in the legend (a text on the plot would cover a line)."""
    if cores:
        ax.axvline(cores, color="grey", lw=1, alpha=0.6, ls="-.", label=f"{cores} cores")


def _integer_ticks(ax, x) -> None:
    if all(float(v).is_integer() for v in x):  # counts (ranks, workers): no 1.25 ticks
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_efficiency(p: Sequence[float], efficiencies: Mapping[str, Sequence[float]], xlabel: str = "ranks",
                    cores: int | None = None, title: str | None = None, ax=None):
    """Parallel efficiency (speedup / p) against worker count, in percent, with 100 % marked."""
    fig, ax = _subplots(figsize=(6, 4)) if ax is None else (ax.figure, ax)
    for (name, e), c in zip(efficiencies.items(), colours(efficiencies)):
        ax.plot(p, 100 * np.asarray(e, dtype=float), "o-", color=c, label=name)
    ax.axhline(100, color=COLOURS["ideal"], ls="--", lw=1, label="ideal (100 %)")
    ax.set_ylim(0, max(110, ax.get_ylim()[1]))
    _mark_cores(ax, cores)
    _integer_ticks(ax, p)
    ax.set(xlabel=xlabel, ylabel="efficiency (speedup / p, %)", title=title or "efficiency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_scaling(*results, title: str | None = None):
    """Speedup (with the ideal line and each result's fitted Amdahl or Gustafson curve, dotted in its colour) beside
    efficiency, for one or more :class:`labkit.scaling.Scaling` results of the same mode."""
    if not results:
        raise ValueError("plot_scaling needs at least one labkit.scaling.Scaling result")
    modes = {r.mode for r in results}
    if len(modes) != 1:
        raise ValueError("plot strong and weak scaling separately: their speedups mean different things")
    weak = modes.pop() == "weak"
    fig, (a1, a2) = _subplots(1, 2, figsize=(11, 4.2))
    ranks = sorted({p for r in results for p in r.ranks})
    cores = results[0].cores if results[0].cores and results[0].cores < max(ranks) else None
    names = [f"{r.workload}, size {r.size}{' per rank' if weak else ''}" for r in results]
    law, curve = ("Gustafson", gustafson) if weak else ("Amdahl", amdahl)
    grid = np.linspace(1, max(ranks), 100)
    # the ideal line on top: a fit with a small serial fraction runs along it and would hide it
    a1.plot(grid, grid, "--", color=COLOURS["ideal"], lw=1, zorder=4, label="ideal (S = p)")
    for name, r, c in zip(names, results, colours(names)):
        a1.plot(r.ranks, r.speedup, "o-", color=c, label=name, zorder=3)
        f = r.serial_fraction
        if 0 <= f <= 1:
            a1.plot(grid, curve(grid, f), ":", color=c, lw=2.5, alpha=0.6, zorder=1,
                    label=f"{law} fit, serial fraction {f:.2f}")
    a1.axhline(1, color="grey", lw=0.8, alpha=0.5)
    _integer_ticks(a1, ranks)
    a1.set(xlabel="ranks", ylabel="scaled speedup (one rank's time / p ranks' time, same problem)" if weak else
           "speedup (T1 / Tp)", title="scaled speedup (weak scaling)" if weak else "speedup (strong scaling)")
    a1.grid(alpha=0.3)
    _mark_cores(a1, cores)
    a1.legend(fontsize=8)
    plot_efficiency(ranks, {n: r.efficiency for n, r in zip(names, results)}, ax=a2, cores=cores)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_rank_timeline(events: Sequence[Mapping], title: str = "timeline", colour_by: str = "name",
                       lane_per_kind: bool = False):
    """One lane per rank, a bar per phase of :class:`labkit.bench.Timeline` events (rank, name, kind, start, end in
    seconds), coloured by phase ``name`` or by ``kind`` (compute / comm): gaps are idle time, long comm bars waiting.
    ``lane_per_kind``: a lane per rank and kind, so that phases that run at once (an allreduce in flight during
    backprop) are seen side by side instead of on top of each other."""
    if not events:
        raise ValueError("no events to draw")
    kinds = list(dict.fromkeys(str(e["kind"]) for e in events))

    def lane(e):
        return (int(e["rank"]), kinds.index(str(e["kind"])) if lane_per_kind else 0)

    lanes = sorted({lane(e) for e in events})
    row = {ln: i for i, ln in enumerate(lanes)}
    keys = list(dict.fromkeys(str(e[colour_by]) for e in events))
    cmap = dict(zip(keys, colours(keys)))
    fig, ax = _subplots(figsize=(9, 0.55 * len(lanes) + 1.8))
    t_min = min(e["start"] for e in events)
    for e in events:
        ax.barh(row[lane(e)], (e["end"] - e["start"]) * 1e3, left=(e["start"] - t_min) * 1e3,
                color=cmap[str(e[colour_by])], edgecolor="white", linewidth=0.5, height=0.7)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in cmap.items()], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks(range(len(lanes)), [f"rank {r}: {kinds[k]}" if lane_per_kind else f"rank {r}" for r, k in lanes])
    ax.invert_yaxis()
    ax.set(xlabel="time (ms)", title=title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_lines(x: Sequence[float], ys: Mapping[str, Sequence[float]], xlabel: str, ylabel: str,
               logx: bool = False, logy: bool = False, title: str | None = None, hline: float | None = None,
               formulas: Mapping[str, Sequence[float]] | None = None):
    """Several measured series against one x axis (for sweeps: width, threads, batch size).

    ``formulas`` are predictions drawn as dashed lines under the measured markers, the i-th formula in the colour
    of the i-th measured series, so a measurement that equals its formula stays visible on it.
    """
    fig, ax = _subplots(figsize=(6.5, 4))
    cols = colours(ys)
    for (name, y), c in zip(ys.items(), cols):
        ax.plot(x, y, "o" if formulas else "o-", color=c, ms=8 if formulas else 6, zorder=3, label=name)
    for i, (name, y) in enumerate((formulas or {}).items()):
        ax.plot(x, y, "--", color=cols[i] if i < len(cols) else None, lw=1.5, zorder=2, label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=1, ls="--")
    if not logx:
        _integer_ticks(ax, x)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title or "")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_curves(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str,
                title: str | None = None, hline: float | None = None, hline_label: str | None = None):
    """Several measured curves, each with x values of its own: ``{name: (x, y)}`` (accuracy against each run's own
    training time, say). ``hline`` draws a dashed level (a target) across them, named ``hline_label``."""
    fig, ax = _subplots(figsize=(6.5, 4))
    for (name, (x, y)), c in zip(curves.items(), colours(curves)):
        ax.plot(x, y, "o-", color=c, ms=6, zorder=3, label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", lw=1, ls="--", label=hline_label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title or "")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_traffic(log, p: int, title: str = "messages", split_round: int | None = None):
    """Who sent how much to whom (left) and when (right), from a TrafficComm log of (src, dst, bytes, round).

    ``split_round`` colours rounds before it as one phase (e.g. the ring's reduce-scatter) and the rest
    as another (its allgather).
    """
    log = np.asarray(log).reshape(-1, 4)
    fig, (ax1, ax2) = _subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 1.6]})
    mat = np.zeros((p, p))
    for src, dst, nbytes, _ in log:
        mat[src, dst] += nbytes
    im = ax1.imshow(mat / 1e3, cmap="Blues")
    for i in range(p):
        for j in range(p):
            if mat[i, j]:
                ax1.text(j, i, f"{mat[i, j] / 1e3:.3g}", ha="center", va="center", fontsize=8,
                         color="white" if mat[i, j] > mat.max() / 2 else "black")
    ax1.set(xlabel="destination rank", ylabel="source rank", title="kB sent", xticks=range(p), yticks=range(p))
    fig.colorbar(im, ax=ax1, fraction=0.046)
    rounds = int(log[:, 3].max()) + 1 if len(log) else 1
    for src, dst, nbytes, rnd in log:
        phase = 0 if split_round is None or rnd < split_round else 1
        c = ["#1f77b4", "#ff7f0e"][phase]
        ax2.annotate("", xy=(rnd + 0.8, dst), xytext=(rnd, src),
                     arrowprops=dict(arrowstyle="->", color=c, lw=0.8 + 2.2 * nbytes / max(log[:, 2].max(), 1)))
    ax2.set(xlim=(-0.3, rounds + 0.1), ylim=(p - 0.5, -0.9), xlabel="round", ylabel="rank", yticks=range(p),
            title=title)
    if split_round is not None:
        ax2.axvline(split_round - 0.1, color="grey", ls="--", lw=1)
        ax2.text(split_round / 2 - 0.1, -0.6, "reduce-scatter", ha="center", va="center", color="#1f77b4", fontsize=9)
        ax2.text((split_round + rounds) / 2 - 0.1, -0.6, "allgather", ha="center", va="center", color="#ff7f0e", fontsize=9)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_cost_model(nbytes, measured: Mapping[str, Sequence[float]], predicted: Mapping[str, Sequence[float]] | None = None,
                    title: str = "time against message size"):
    """Measured times (points) and the alpha-beta model's predictions (lines), log-log, one colour per algorithm."""
    fig, ax = _subplots(figsize=(7, 4.5))
    names = list(dict.fromkeys(list(measured) + list(predicted or {})))
    cols = dict(zip(names, colours(names)))
    for name, t in measured.items():
        ax.plot(nbytes, np.asarray(t) * 1e6, "o", color=cols[name], label=f"{name} (measured)")
    for name, t in (predicted or {}).items():
        ax.plot(nbytes, np.asarray(t) * 1e6, "-", color=cols[name], alpha=0.7, label=f"{name} (model)")
    ax.set(xscale="log", yscale="log", xlabel="array size (bytes)", ylabel="time (µs)", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def plot_bars(values: Mapping[str, float], xlabel: str, title: str | None = None, fmt: str = "{:.3g}",
              line: float | None = None, line_label: str | None = None, labels: Sequence[str] | None = None):
    """Horizontal bars of any measured value (accuracy, bytes...), each labelled (``fmt``, or ``labels``);
    ``line`` marks a reference."""
    names = list(values)
    vals = np.array([values[k] for k in names], dtype=float)
    fig, ax = _subplots(figsize=(8, 0.5 * len(names) + 1.2))
    ax.barh(names, vals, color=colours(names))
    ax.invert_yaxis()
    for i, (v, label) in enumerate(zip(vals, labels or [fmt.format(v) for v in vals])):
        ax.text(v, i, " " + label, va="center", fontsize=9)
    if line is not None:
        ax.axvline(line, color="grey", ls="--", lw=1)
        if line_label:
            ax.text(line, -0.55, f" {line_label}", color="grey", fontsize=8, va="bottom")
    ax.set(xlabel=xlabel, xlim=(0, max(vals.max(), line or 0) * 1.35))
    ax.set_title(title or "", pad=14 if line_label else None)  # room for the reference line's label
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_heatmaps(maps: Mapping[str, np.ndarray], title: str | None = None, label: str = "", shared_scale: bool = True):
    """2-D arrays side by side as images (row 0 at the top), each with its colour bar; one colour scale for all with
    ``shared_scale``, so that equal colours mean equal values."""
    names = list(maps)
    arrays = [np.asarray(maps[k], dtype=float) for k in names]
    top = max(float(a.max()) for a in arrays) if shared_scale else None
    fig, axes = _subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, name, a in zip(axes[0], names, arrays):
        im = ax.imshow(a, cmap="viridis", vmin=0 if shared_scale else None, vmax=top, interpolation="nearest")
        ax.set_title(name, fontsize=10)
        ax.set(xlabel="column", ylabel="row")
        fig.colorbar(im, ax=ax, label=label, shrink=0.85)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_staleness(staleness: Mapping[str, Sequence[int]], title: str = "staleness of the applied updates"):
    """One histogram per run of how many updates old each applied gradient was (0 = computed on the newest)."""
    fig, ax = _subplots(figsize=(9.5, 3.8))
    series = {k: np.asarray(v, dtype=int) for k, v in staleness.items()}
    top = max((int(s.max()) for s in series.values() if s.size), default=0)
    width = 0.8 / max(len(series), 1)
    for i, ((name, s), c) in enumerate(zip(series.items(), colours(series))):
        counts = np.bincount(s, minlength=top + 1) / max(s.size, 1)
        ax.bar(np.arange(top + 1) + (i - (len(series) - 1) / 2) * width, counts, width, color=c,
               label=f"{name} (mean {s.mean():.1f}, max {s.max()})" if s.size else name)
    ax.set(xlabel="staleness (updates applied since the weights were read)", ylabel="fraction of updates", title=title)
    ax.set_xticks(range(top + 1)) if top <= 12 else _integer_ticks(ax, [0, top])  # whole updates only
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over the tallest
    fig.tight_layout()
    return fig


def plot_accuracy_table(rows, hline: float | None = None, title: str | None = None):
    """Test accuracy against the number of workers, one line per (learning rate, masters), from rows of
    (workers, masters, lr, accuracy, ...) as :func:`labkit.param_server.accuracy_table` gives them; prints them too."""
    print("workers  masters    lr   accuracy   mean staleness   seconds")
    for w, m, lr, acc, st, sec in rows:
        print(f"{w:7d}  {m:7d}  {lr:4.1f}   {acc:8.2%}   {st:14.2f}   {sec:7.2f}")
    most = max(r[0] for r in rows)
    series = {}
    for m in sorted({r[1] for r in rows}):
        for lr in sorted({r[2] for r in rows}):
            acc = {r[0]: r[3] for r in rows if r[1] == m and r[2] == lr}
            series[f"lr {lr}, {m} master{'s' if m > 1 else ''}"] = [acc.get(w, np.nan) for w in range(1, most + 1)]
    return plot_lines(range(1, most + 1), series, xlabel="workers", ylabel="test accuracy", hline=hline, title=title)


def plot_timeline(events, title: str = "pipeline schedule", stage_names: Sequence[str] | None = None):
    """A Gantt chart of (rank, kind 0=forward 1=backward, micro-batch, start s, end s) rows, one lane per rank;
    white space is the bubble."""
    ev = np.asarray(events, dtype=float).reshape(-1, 5)
    ranks = sorted({int(r) for r in ev[:, 0]})
    fig, ax = _subplots(figsize=(9, 0.6 * len(ranks) + 1.6))
    kinds = {0: ("forward", "#1f77b4"), 1: ("backward", "#ff7f0e")}
    for r, kind, mb, t0, t1 in ev:
        ax.barh(int(r), (t1 - t0) * 1e3, left=t0 * 1e3, color=kinds[int(kind)][1], edgecolor="white", height=0.7)
        if (t1 - t0) > 0.04 * (ev[:, 4].max() - ev[:, 3].min()):
            ax.text((t0 + t1) / 2 * 1e3, int(r), str(int(mb)), ha="center", va="center", color="white", fontsize=8)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=name) for name, c in kinds.values()], fontsize=8, loc="lower right")
    ax.set_yticks(ranks, stage_names or [f"stage {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set(xlabel="time (ms)", title=title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_tradeoff(points: Mapping[str, tuple[float, float]], xlabel: str, ylabel: str, logx: bool = False,
                  title: str | None = None, hline: float | None = None):
    """One labelled point per method: what it costs (x) against what it gives (y), e.g. bytes against accuracy."""
    fig, ax = _subplots(figsize=(8.5, 4.5))
    for (name, (x, y)), c in zip(points.items(), colours(points)):
        ax.plot([x], [y], "o", color=c, ms=8, label=name)
    # named in a legend beside the axes: labels next to points overlap where points crowd and run past the edge
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if hline is not None:
        ax.axhline(hline, color="grey", lw=1, ls="--")
    if logx:
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title or "")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def plot_stacked_bars(labels: Sequence[str], parts: Mapping[str, Sequence[float]], unit: str = "s",
                      normalise: bool = False, title: str | None = None):
    """One horizontal bar per label, split into ``parts`` (phases: compute, communication, copies...).

    ``normalise=True`` draws each bar as shares of its own total (for totals that differ by orders of
    magnitude); the total is written at the end of every bar either way.
    """
    labels = list(labels)
    names = list(parts)
    vals = np.array([[float(v) for v in parts[k]] for k in names])  # (parts, labels)
    if vals.shape != (len(names), len(labels)):
        raise ValueError(f"every part needs one value per label ({len(labels)}); got shape {vals.shape}")
    if (vals < 0).any():
        raise ValueError("stacked bars need values >= 0")
    totals = vals.sum(axis=0)
    shown = vals / np.where(totals > 0, totals, 1) if normalise else vals
    fig, ax = _subplots(figsize=(9, 0.5 * len(labels) + 1.6))
    left = np.zeros(len(labels))
    for name, row, c in zip(names, shown, colours(names)):
        ax.barh(labels, row, left=left, color=c, label=name)
        left += row
    ax.invert_yaxis()
    for i, t in enumerate(totals):
        ax.text(left[i], i, f" {t:.3g} {unit}", va="center", fontsize=9)
    ax.set(xlabel="share of the total" if normalise else unit, title=title or "",
           xlim=(0, (1.0 if normalise else left.max()) * 1.3))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_roofline(points: Mapping[str, tuple[float, float]], peak_gflops: float, bandwidth_gbs: float,
                  peak_label: str = "peak compute", bandwidth_label: str = "memory bandwidth", title: str | None = None,
                  more_bandwidths: Mapping[str, float] | None = None):
    """The roofline: attainable GFLOP/s = min(peak, intensity x bandwidth), on log-log axes, with each measured
    kernel at (arithmetic intensity in FLOP/byte, achieved GFLOP/s). Labels say where the ceilings came from;
    ``more_bandwidths`` (label: GB/s) draws further memory ceilings dashed (a cache's, beside DRAM's)."""
    if peak_gflops <= 0 or bandwidth_gbs <= 0:
        raise ValueError(f"the ceilings must be positive, got {peak_gflops} GFLOP/s and {bandwidth_gbs} GB/s")
    xs = [p[0] for p in points.values()]
    lo, hi = min([*xs, peak_gflops / bandwidth_gbs]) / 4, max([*xs, peak_gflops / bandwidth_gbs]) * 4
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig, ax = _subplots(figsize=(6.5, 4.5))
    ax.plot(grid, np.minimum(peak_gflops, grid * bandwidth_gbs), color="black", lw=1.5)
    ridge = peak_gflops / bandwidth_gbs
    ax.text(lo * 1.1, lo * 1.1 * bandwidth_gbs * 1.15, f"{bandwidth_label}: {bandwidth_gbs:.3g} GB/s", fontsize=8,
            va="bottom")
    ax.text(hi / 1.1, peak_gflops * 1.08, f"{peak_label}: {peak_gflops:.3g} GFLOP/s", fontsize=8, ha="right", va="bottom")
    ax.axvline(ridge, color="grey", lw=0.8, ls=":")
    for label, gbs in (more_bandwidths or {}).items():
        ax.plot(grid, np.minimum(peak_gflops, grid * gbs), color="grey", lw=1, ls="--")
        ax.text(lo * 1.1, lo * 1.1 * gbs * 1.15, f"{label}: {gbs:.3g} GB/s", fontsize=8, va="bottom", color="grey")
    for (name, (x, y)), c in zip(points.items(), colours(points)):
        ax.plot([x], [y], "o", color=c, ms=7, label=f"{name}: {y:.3g} GFLOP/s")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte moved)", ylabel="GFLOP/s",
           title=title or "roofline", xlim=(lo, hi))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_speed_of_light(results: Mapping[str, object], title: str | None = None):
    """Each kernel's modelled time by unit (:class:`labkit.kernels.speed_of_light.SpeedOfLight` by name): a row of
    bars per kernel, one per unit that has work, on a log scale; the unit that sets the bound is outlined and named."""
    if not results:
        raise ValueError("no kernels to draw: pass {name: speed_of_light.model(...)}")
    names = list(results)
    units = [u for u in next(iter(results.values())).times if any(r.times[u] > 0 for r in results.values())]
    fig, ax = _subplots(figsize=(9, 0.9 * len(names) + 1.6))
    height = 0.8 / len(units)
    for k, (unit, c) in enumerate(zip(units, colours(units))):
        ys = np.arange(len(names)) + (k - (len(units) - 1) / 2) * height
        vals = [results[n].times[unit] * 1e6 for n in names]
        bound = [results[n].unit == unit for n in names]
        ax.barh(ys, vals, height=height, color=c, label=unit, edgecolor=["black" if b else c for b in bound],
                linewidth=[2 if b else 0 for b in bound])
        for y, v, b in zip(ys, vals, bound):
            if b:
                ax.text(v, y, f" bound: {v:.3g} µs", va="center", fontsize=8, fontweight="bold")
    ax.set_yticks(np.arange(len(names)), names)
    ax.invert_yaxis()
    g = next(iter(results.values())).gpu.name
    ax.set(xscale="log", xlabel=f"µs on {g} (modelled from counts; a lower bound)", title=title or f"speed of light on {g}")
    ax.set_xlim(right=ax.get_xlim()[1] * 20)  # room for the bound's label
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    return fig
