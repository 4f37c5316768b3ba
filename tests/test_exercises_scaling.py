"""The exercises of lab 12 (labkit.check.scaling): their answers for the contract every exercise keeps (``CONTRACT``,
tests/test_contract.py: right, blank, hints, replay, labkit's own), and the typical wrong ones, each named by the
check's message; with labkit's helpers the lab uses (bench.speedup_table, fit_amdahl_times,
karp_flatt, scaling.yours_or_labkits, Scaling.samples)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Answers, Reference, blank, record_check

from labkit import bench, check, questions, scaling
from labkit.bench import Timing
from labkit.check import ExerciseError
from labkit.check.exercises import exercise, in_lab
from labkit.grading import replay

SEED = 4242


# ---- right answers, as a student would write them ---------------------------------------------------------------

def right_speedup_efficiency(p, t):
    p, t = np.asarray(p, dtype=float), np.asarray(t, dtype=float)
    if not np.any(p == 1):
        raise ValueError("no one-worker row")
    s = t[p == 1][0] / t
    return s, s / p


def right_gustafson_fit(t_one_rank, t_p_ranks):
    s = np.asarray(t_one_rank) / np.asarray(t_p_ranks)
    if s.size < 2:
        raise ValueError("one rank count: nothing to fit")
    x, y = np.arange(1, s.size), np.arange(2, s.size + 1) - s[1:]  # p - 1 and p - S, rows p > 1
    return s, float(x @ y / (x @ x))


def right_karp_flatt(p, s):
    p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 1, (1 / s - 1 / p) / (1 - 1 / p), np.nan)


def right_amdahl_fit(p, t):
    p, t = np.asarray(p, dtype=float), np.asarray(t, dtype=float)
    if len(set(p.tolist())) < 2:
        raise ValueError("one worker count")
    A = np.column_stack([np.ones_like(p), 1 / p])  # the line t = a + b / p, by lstsq rather than polyfit
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    return a / (a + b), a + b


def breakdown(last_start=lambda group, comm: max(e["start"] for e in group), compute=lambda e: e["kind"] == "compute",
              rows=sorted, waiting=True):
    """A wait_breakdown answer as a student writes it, with one of its rules changed."""
    def fn(events):
        ranks = rows(list(dict.fromkeys(e["rank"] for e in events)))
        out = np.zeros((len(ranks), 3))
        comm = [e for e in events if e["kind"] == "comm"]
        for e in events:
            if compute(e):
                out[ranks.index(e["rank"]), 0] += e["end"] - e["start"]
        for name in {e["name"] for e in comm}:
            group = [e for e in comm if e["name"] == name]
            last = last_start(group, comm)
            for e in group:
                wait = max(0.0, min(e["end"], last) - e["start"]) if waiting else 0.0
                out[ranks.index(e["rank"]), 1] += wait
                out[ranks.index(e["rank"]), 2] += e["end"] - e["start"] - wait
        return out
    return fn


def wire_step(compute=lambda t1, p, cores: t1 / min(p, cores), messages=lambda p: 2 * (p - 1),
              block=lambda nbytes, p: nbytes / p, latency=True):
    """A wire_step answer as a student writes it, with one of its rules changed."""
    def fn(t1, ranks, cores, alpha, beta, nbytes):
        return np.array([compute(t1, p, cores) + messages(p) * ((alpha if latency else 0.0) + block(nbytes, p) * beta)
                         for p in ranks])
    return fn


RIGHT = {"speedup_efficiency": right_speedup_efficiency, "gustafson_fit": right_gustafson_fit,
         "karp_flatt": right_karp_flatt, "amdahl_fit": right_amdahl_fit, "wait_breakdown": breakdown(),
         "wire_step": wire_step()}


def test_lab_12_declares_its_exercises_with_hints_and_references():
    assert sorted(e.name for e in in_lab("12")) == sorted(RIGHT)
    for name in RIGHT:
        e = exercise(name)
        assert e.module == "scaling" and len(e.hints) >= 3 and e.references
        for ref in e.references:  # each names a function of labkit that exists
            module, attr = ref.split(":")
            assert callable(getattr(__import__(module, fromlist=[attr]), attr))


# ---- the typical mistakes, each named ---------------------------------------------------------------------------

def _with_s(s_of):
    """A speedup_efficiency with its own (wrong) speedup, efficiency = speedup / p, refusing a table without p = 1."""
    def fn(p, t):
        if not np.any(p == 1):
            raise ValueError("no baseline")
        s = s_of(p, t)
        return s, s / p
    return fn


def _with_e(e_of):
    def fn(p, t):
        s, _ = right_speedup_efficiency(p, t)
        return s, e_of(s, p)
    return fn


@pytest.mark.parametrize("wrong, match", [
    (_with_s(lambda p, t: t[0] / t), "baseline is the table's first row, but the rows are not sorted by p"),
    (_with_s(lambda p, t: t / t[p == 1][0]), "upside down"),
    (_with_s(lambda p, t: t.max() / t), "baseline is the slowest time"),
    (_with_e(lambda s, p: s), "efficiency equals the speedup: efficiency divides the speedup by p"),
    (_with_e(lambda s, p: s * p), "yours multiplies"),
    (_with_e(lambda s, p: s / np.arange(1, len(p) + 1)), "divided by the row number"),
    (_with_e(lambda s, p: np.minimum(s / p, 1)), "clipped the efficiency at 1"),
    (lambda p, t: (t[p == 1][0] / t, t[p == 1][0] / t / p), "your function raised IndexError(?s:.*)no baseline"),
    (lambda p, t: right_speedup_efficiency(p, t)[0], "expected a pair \\(S, E\\)"),
])
def test_speedup_efficiency_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.speedup_efficiency(wrong)


def test_a_table_without_a_baseline_must_be_refused():
    def guesses(p, t):  # right on every table with p = 1; guesses the fastest row's time otherwise
        return right_speedup_efficiency(p, t) if np.any(p == 1) else (t.min() / t, t.min() / t / p)

    with pytest.raises(ExerciseError, match=r"(?s)without a one-worker row.*instead of raising ValueError.*no baseline"):
        check.speedup_efficiency(guesses)


def _gustafson(speedup=lambda t1, tp: t1 / tp, fraction=None):
    """A student's gustafson_fit: right but for the part given."""
    def fn(t1, tp):
        s = speedup(np.asarray(t1, dtype=float), np.asarray(tp, dtype=float))
        if np.size(t1) < 2:
            raise ValueError("one rank count")
        p = np.arange(1, np.size(t1) + 1, dtype=float)
        return s, right_gustafson_fit(t1, tp)[1] if fraction is None else float(fraction(p, t1 / tp))
    return fn


@pytest.mark.parametrize("wrong, match", [
    (_gustafson(lambda t1, tp: tp / t1), "upside down"),
    (_gustafson(lambda t1, tp: t1[0] / tp), "strong-scaling speedup"),
    (_gustafson(lambda t1, tp: t1 / tp / np.arange(1, len(t1) + 1)), "that is the efficiency"),
    (_gustafson(lambda t1, tp: np.arange(1, len(t1) + 1) * t1[0] / tp), "grows exactly p-fold"),
    (_gustafson(lambda t1, tp: tp[0] / tp), "weak-scaling efficiency"),  # = t1[0] / tp: at p = 1 both are one problem
    (_gustafson(lambda t1, tp: t1 / tp + 0.1), "(?s)yours.*expected.*\nStep 1 of"),  # named by nothing: a step
    (_gustafson(fraction=lambda p, s: np.mean((p[1:] - s[1:]) / (p[1:] - 1))), "mean of each row's own f"),
    (_gustafson(fraction=lambda p, s: (p[-1] - s[-1]) / (p[-1] - 1)), "last row alone"),
    (_gustafson(fraction=lambda p, s: np.polyfit(p - 1, p - s, 1)[0]), "line with an intercept"),
    (_gustafson(fraction=lambda p, s: bench.fit_amdahl(p, s)), "Amdahl's law fitted to the scaled speedups"),
    (_gustafson(fraction=lambda p, s: 1 - bench.fit_gustafson(p, s)), "parallel share"),
    (_gustafson(fraction=lambda p, s: bench.fit_gustafson(p - 1, s)), "off by one"),
    (_gustafson(fraction=lambda p, s: bench.fit_gustafson(p, s) + 0.01), "(?s)your f.*expected.*through the origin"),
])
def test_gustafson_fit_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.gustafson_fit(wrong)


def test_gustafson_fit_refuses_one_rank_count_with_value_error():
    def fits_anyway(t1, tp):
        return (np.asarray(t1) / np.asarray(tp), 0.0) if np.size(t1) < 2 else right_gustafson_fit(t1, tp)

    with pytest.raises(ExerciseError, match=r"(?s)one rank count only.*instead of raising ValueError.*every f fits"):
        check.gustafson_fit(fits_anyway)
    assert bench.fit_gustafson_times([1.0, 1.9], [1.0, 1.0])[1] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="more than one worker"):
        bench.fit_gustafson_times([0.5], [0.5])


def _kf(formula):
    def fn(p, s):
        with np.errstate(divide="ignore", invalid="ignore"):
            return formula(np.asarray(p, dtype=float), np.asarray(s, dtype=float))
    return fn


@pytest.mark.parametrize("wrong, match", [
    (_kf(lambda p, s: 1 / s - 1 / p), "e times \\(1 - 1/p\\)"),
    (_kf(lambda p, s: (1 / p - 1 / s) / (1 - 1 / p)), "sign is flipped"),
    (_kf(lambda p, s: (s - p) / (1 - p)), "1/S and 1/p, not with S and p"),
    (_kf(lambda p, s: 1 - right_karp_flatt(p, s)), "parallel share"),
    (_kf(lambda p, s: np.clip(right_karp_flatt(p, s), 0, 1)), "clipped e to \\[0, 1\\]"),
    (_kf(lambda p, s: np.nan_to_num(right_karp_flatt(p, s))), "undefined at p = 1; return NaN"),
    (_kf(lambda p, s: float(right_karp_flatt(p, s)[0])), "expected an array of shape"),
])
def test_karp_flatt_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.karp_flatt(wrong)


def _fit(f_t1):
    """An amdahl_fit built on the line t = a + b x (x = 1/p unless the mistake says otherwise), refusing one p."""
    def fn(p, t):
        p, t = np.asarray(p, dtype=float), np.asarray(t, dtype=float)
        if len(set(p.tolist())) < 2:
            raise ValueError("one worker count")
        return f_t1(p, t)
    return fn


def _line(x, t):
    b, a = np.polyfit(x, t, 1)
    return a, b


@pytest.mark.parametrize("wrong, match", [
    (_fit(lambda p, t: (lambda a, b: (b / (a + b), a + b))(*_line(1 / p, t))), "swapped the serial and the parallel"),
    (_fit(lambda p, t: (lambda a, b: (a / (a + b), a + b))(*_line(p, t))), "fitted T against p, not against 1/p"),
    (_fit(lambda p, t: (lambda a, b: (a, a + b))(*_line(1 / p, t))), "your f is in seconds"),
    (_fit(lambda p, t: (lambda a, b: (a / t[p == 1].mean(), a + b))(*_line(1 / p, t))),
     "divided by the measured one-worker time"),
    (_fit(lambda p, t: (bench.fit_amdahl(p, t[p == 1].mean() / t), t[p == 1].mean())), "you fitted the speedups"),
    (_fit(lambda p, t: (lambda a, b: (max(a / (a + b), 0.0), a + b))(*_line(1 / p, t))), "clipped f to \\[0, 1\\]"),
    (_fit(lambda p, t: (lambda a, b: (a / (a + b), a + b))(*_line(1 / p[[p.argmin(), p.argmax()]],
                                                                  t[[p.argmin(), p.argmax()]]))),
     "(?s)noisy.*two rows, the smallest and the largest p"),
    (_fit(lambda p, t: (lambda a, b: (a / (a + b), t[p == 1].mean()))(*_line(1 / p, t))),
     "your T1 is the measured one-worker time"),
    (_fit(lambda p, t: (lambda a, b: (a / (a + b), a))(*_line(1 / p, t))), "value at 1/p = 0"),
    (_fit(lambda p, t: (lambda a, b: [a / (a + b)])(*_line(1 / p, t))), "expected a pair \\(f, T1\\)"),
    (_fit(lambda p, t: (np.array([0.1, 0.2]), 1.0)), "f should be one number"),
    (_fit(lambda p, t: (lambda a, b: (a / (a + b) + 0.01, a + b))(*_line(1 / p, t))),
     "(?s)your f:.*least squares makes the sum"),
])
def test_amdahl_fit_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.amdahl_fit(wrong)


@pytest.mark.parametrize("wrong, match", [
    (lambda p, t: right_amdahl_fit(p, t) if len(set(np.asarray(p).tolist())) > 1 else (0.0, float(np.mean(t))),
     "one worker count only(?s:.*)instead of raising ValueError"),
    (lambda p, t: right_amdahl_fit(p, t) if len(set(np.asarray(p).tolist())) > 1 else 1 / 0,
     "raised ZeroDivisionError(?s:.*)raise ValueError"),
    (lambda p, t: right_amdahl_fit(p, t) if len(set(np.asarray(p).tolist())) > 1 else
     (_ for _ in ()).throw(np.linalg.LinAlgError("singular")), "raised LinAlgError"),  # a subclass is not enough:
])  # the replay re-raises a recorded exception by its name, and only the built-in ones keep their class
def test_one_worker_count_must_be_refused_with_value_error(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.amdahl_fit(wrong)


# ---- the hints ----------------------------------------------------------------------------------------------

ANSWERS = {"speedup_efficiency": ["/ p", "t[p == 1]", "S / p"],
           "gustafson_fit": ["t_one_rank /", "/ t_p_ranks", "x @ y", "sum(x * y)"],
           "karp_flatt": ["1 - 1/p", "1/S - 1/p", "1/p)"], "amdahl_fit": ["a + b", "a / (", "intercept /", "f = "],
           "wait_breakdown": ["min(", "max(e", "- e[\"start\"]"],
           "wire_step": ["2 * (p - 1)", "nbytes / p *", "t1 / min"]}


def test_the_hints_lead_to_the_answer_but_never_hold_it():
    for e in in_lab("12"):
        text = " ".join(e.hints)
        assert not [bit for bit in ANSWERS[e.name] if bit in text], e.name


# ---- the contract's answers (tests/test_contract.py) -------------------------------------------------------------

def _record(monkeypatch, folder, name, fn, seed=SEED):
    return record_check(monkeypatch, folder, name, fn, seed)


CONTRACT = {
    "speedup_efficiency": Answers(
        right_speedup_efficiency, _with_e(lambda s, p: s), passes="✔ speedup and efficiency: all 9 checks passed",
        replayed=lambda p, t: (t / t, t / t),  # also answers the table without p = 1
        references=(Reference(bench.speedup_table, "labkit.bench.speedup_table"),)),
    "gustafson_fit": Answers(
        right_gustafson_fit, _gustafson(lambda t1, tp: tp / t1), passes="✔ Gustafson fit: all 7 checks passed",
        references=(Reference(bench.fit_gustafson_times, "labkit.bench.fit_gustafson_times"),)),
    "karp_flatt": Answers(
        right_karp_flatt, _kf(lambda p, s: 1 / s - 1 / p), passes="✔ Karp-Flatt metric: all 9 checks passed",
        references=(Reference(bench.karp_flatt, "labkit.bench.karp_flatt"),)),
    "amdahl_fit": Answers(
        right_amdahl_fit, _fit(lambda p, t: (lambda a, b: (a / (a + b), a + b))(*_line(p, t))),
        replayed=lambda p, t: right_amdahl_fit(p, t) if len(set(np.asarray(p).tolist())) > 1 else (0.5, 1.0),
        passes="✔ Amdahl fit: all 8 checks passed",
        references=(Reference(lambda p, t: bench.fit_amdahl_times(p, t), "labkit.bench.fit_amdahl_times"),
                    Reference(bench.fit_amdahl_times, "labkit.bench.fit_amdahl_times"))),
    "wait_breakdown": Answers(
        breakdown(), breakdown(waiting=False), passes="✔ waiting or sending: all 10 checks passed",
        references=(Reference(bench.wait_breakdown, "labkit.bench.wait_breakdown"),)),
    "wire_step": Answers(
        wire_step(), wire_step(latency=False), replayed=wire_step(messages=lambda p: p - 1),
        passes="✔ the step on a network that costs: all 6 checks passed",
        references=(Reference(scaling.predicted_step, "labkit.scaling.predicted_step"),)),
}


# ---- exercise 5: waiting or sending -----------------------------------------------------------------------------

def shortest_time(events):
    """Waiting read as each rank's time in the collective less the shortest: right while all ranks leave together."""
    out = breakdown()(events)
    total = out[:, 1] + out[:, 2]
    return np.column_stack([out[:, 0], total - total.min(), np.full(len(out), total.min())])


@pytest.mark.parametrize("wrong, match", [
    (breakdown(waiting=False), r"3 ranks, uneven: no waiting at all.*cannot finish it before the last rank enters"),
    (breakdown(last_start=lambda group, comm: min(e["start"] for e in group)),
     r"3 ranks, uneven: no waiting at all.*cannot finish it before the last rank enters"),
    (breakdown(last_start=lambda group, comm: max(e["start"] for e in comm)),
     r"2 ranks, two collectives: wrong waiting column.*each collective waits for its own last rank"),
    (breakdown(compute=lambda e: e["name"] == "backprop"), r"one rank: wrong compute column.*the update too"),
    (breakdown(rows=lambda ranks: ranks), r"3 ranks, uneven, events in any order: wrong compute column.*in rank order"),
    (lambda events: breakdown()(events).T, r"one rank: shape \(3, 1\), expected \(1, 3\).*transposed"),
    (lambda events: breakdown()(events)[:, :2], r"one rank: shape \(1, 2\), expected \(1, 3\)"),
    (lambda events: breakdown()(events) * [1, 1, 0.5], r"one rank: wrong transfer column.*less the waiting"),
    (lambda events: shortest_time(events), r"3 ranks that leave at different times: wrong waiting column"),
])
def test_wait_breakdown_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.wait_breakdown(wrong)


def every_rank_stays(events):
    """Waiting taken as the last rank's entry less the rank's own: right while no rank leaves before the last enters."""
    out = breakdown()(events)
    ranks = sorted({e["rank"] for e in events})
    out[:, 1:] = 0.0
    comm = [e for e in events if e["kind"] == "comm"]
    for name in {e["name"] for e in comm}:
        group = [e for e in comm if e["name"] == name]
        last = max(e["start"] for e in group)
        for e in group:
            out[ranks.index(e["rank"]), 1:] += last - e["start"], e["end"] - last
    return out


def last_ranks_transfer(events):
    """Every rank's transfer taken as the last rank's time in the collective, the rest of its time as waiting."""
    out = breakdown()(events)
    ranks = sorted({e["rank"] for e in events})
    out[:, 1:] = 0.0
    comm = [e for e in events if e["kind"] == "comm"]
    for name in {e["name"] for e in comm}:
        group = [e for e in comm if e["name"] == name]
        final = max(group, key=lambda e: e["start"])
        for e in group:
            moved = final["end"] - final["start"]
            out[ranks.index(e["rank"]), 1:] += e["end"] - e["start"] - moved, moved
    return out


def one_collective_a_rank(events):
    """One comm event per rank assumed: a dict by rank keeps the last one listed."""
    out = breakdown()(events)
    ranks = sorted({e["rank"] for e in events})
    mine = {e["rank"]: e for e in events if e["kind"] == "comm"}
    last = max(e["start"] for e in mine.values())
    out[:, 1:] = 0.0
    for r, e in mine.items():
        wait = max(0.0, min(e["end"], last) - e["start"])
        out[ranks.index(r), 1:] = wait, e["end"] - e["start"] - wait
    return out


def collectives_by_place(events):
    """A rank's k-th comm event listed taken as its k-th collective: right while the events come sorted by time."""
    out = breakdown()(events)
    ranks = sorted({e["rank"] for e in events})
    out[:, 1:] = 0.0
    mine = {r: [e for e in events if e["rank"] == r and e["kind"] == "comm"] for r in ranks}
    for k in range(max(len(v) for v in mine.values())):
        group = [v[k] for v in mine.values() if len(v) > k]
        last = max(e["start"] for e in group)
        for e in group:
            wait = min(e["end"], last) - e["start"]
            out[ranks.index(e["rank"]), 1:] += wait, e["end"] - e["start"] - wait
    return out


# Each passed the check before it tried a rank that leaves before the last one enters and two collectives shuffled
WRONG_WAITING = {
    "every rank stays till the last enters": (every_rank_stays, r"3 ranks, rank 0 leaves before rank 2 enters: wrong "
                                              r"waiting column.*rank 0 left allreduce at 0.9 s, before the last rank "
                                              r"entered it at 1.1 s: ranks need not leave together"),
    "the last rank's transfer for all": (last_ranks_transfer, r"3 ranks that leave at different times: wrong waiting "
                                         r"column.*the last rank's time in the collective as its transfer"),
    "the last one listed entered last": (breakdown(last_start=lambda group, comm: group[-1]["start"]),
                                         r"ranks 0, 1 and 7, listed 7 first: wrong waiting column.*the one whose start "
                                         r"is latest, not the one listed last"),
    "one collective a rank": (one_collective_a_rank, r"2 ranks, two collectives: wrong waiting column.*a step may hold "
                              r"several collectives"),
    "collectives by their place in the list": (collectives_by_place, r"3 ranks, two collectives, events in any order: "
                                               r"wrong waiting column.*k-th event listed need not be its k-th collective"),
    "a negative transfer": (lambda events: breakdown()(events) - [0.0, 0.0, 0.4], r"a negative time.*neither is below 0"),
}


@pytest.mark.parametrize("name", sorted(WRONG_WAITING))
def test_wait_breakdown_names_the_mistakes_of_ranks_leaving_early_and_of_order(name):
    wrong, match = WRONG_WAITING[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.wait_breakdown(wrong)


@pytest.mark.parametrize("name", ["every rank stays till the last enters", "collectives by their place in the list"])
def test_the_replay_names_them_too(tmp_path, monkeypatch, name):
    plain = _record(monkeypatch, tmp_path, "wait_breakdown", WRONG_WAITING[name][0])
    assert plain[0] is False
    assert replay.replay("wait_breakdown", tmp_path, SEED) == (False, plain[1].split("\nStep ")[0])


def test_wait_breakdown_splits_a_collective_at_its_last_rank():
    events = [{"rank": r, "name": n, "kind": k, "start": a, "end": b} for r, n, k, a, b in (
        (1, "backprop", "compute", 0.0, 2.0), (1, "allreduce", "comm", 2.0, 2.5),
        (0, "backprop", "compute", 0.0, 1.0), (0, "allreduce", "comm", 1.0, 2.5), (0, "update", "compute", 2.5, 2.6))]
    np.testing.assert_allclose(bench.wait_breakdown(events), [[1.1, 1.0, 0.5], [2.0, 0.0, 0.5]])


# ---- labkit's helpers for lab 12 --------------------------------------------------------------------------------

def test_speedup_table_reads_against_the_one_worker_row():
    s, e = bench.speedup_table([4, 1, 2], [0.3, 1.2, 0.5])
    np.testing.assert_allclose(s, [4.0, 1.0, 2.4])
    np.testing.assert_allclose(e, [1.0, 1.0, 1.2])  # above 1 is kept
    with pytest.raises(ValueError, match="no row with one worker"):
        bench.speedup_table([2, 4], [1.0, 0.6])
    with pytest.raises(ValueError, match="same length"):
        bench.speedup_table([1, 2], [1.0])


def test_fit_amdahl_times_recovers_f_and_t1_from_times_linear_in_one_over_p():
    p = np.array([4, 1, 2, 8, 1, 16])
    for f, t1 in ((0.0, 1.0), (0.05, 3.0), (0.3, 0.02)):
        got = bench.fit_amdahl_times(p, t1 * (f + (1 - f) / p))
        assert got == pytest.approx((f, t1), abs=1e-12, rel=1e-10)
    assert bench.fit_amdahl_times([1, 2, 4], [1.0, 0.46, 0.22])[0] < 0  # faster than linear: as it is
    with pytest.raises(ValueError, match="at least two worker counts"):
        bench.fit_amdahl_times([2, 2, 2], [0.5, 0.6, 0.55])


def test_karp_flatt_is_nan_at_one_worker_without_a_warning():
    with np.errstate(all="raise"):
        e = bench.karp_flatt([1, 2, 4], [1.0, 1.6, 2.5])
    assert np.isnan(e[0]) and e[1:] == pytest.approx([0.25, 0.2])
    assert np.isnan(bench.karp_flatt(1, 1.0)) and bench.karp_flatt(2, 2.0) == 0.0


def test_result_of_uses_the_students_result_only_where_it_agrees(capsys, monkeypatch):
    monkeypatch.setattr(questions, "_said", set())  # each line is said once per cell run: outside IPython, once
    p, t = np.array([1, 2]), np.array([1.0, 0.6])
    got = questions.result_of(right_speedup_efficiency, bench.speedup_table, p, t, what="mine", agree=True)
    assert got[1][1] == pytest.approx(5 / 6) and capsys.readouterr().out == ""
    for fn, says in ((blank, "mine is not written yet"), (lambda p, t: 1 / 0, "mine raised ZeroDivisionError"),
                     (lambda p, t: (t, t), "mine gave another answer than labkit's")):
        got = questions.result_of(fn, bench.speedup_table, p, t, what="mine", agree=True)
        assert got[0] == pytest.approx([1.0, 1 / 0.6]) and says in capsys.readouterr().out
    assert questions.result_of(lambda p, t: (t, t), bench.speedup_table, p, t)[0] is t  # not asked to agree: yours


def test_a_scaling_result_gives_its_samples_its_one_rank_times_and_a_table_without_the_fit():
    strong = scaling.Scaling("backprop", "strong", 4096, [1, 2, 4], [Timing([1.0, 1.1]), Timing([0.6]), Timing([0.5])],
                             cores=2)
    p, t = strong.samples()
    assert p.tolist() == [1, 1, 2, 4] and t.tolist() == [1.0, 1.1, 0.6, 0.5]
    assert strong.samples(strong.fitted_ranks)[0].tolist() == [1, 1, 2]
    assert "Karp-Flatt" in strong.table() and "serial fraction" in strong.table()
    assert "Karp-Flatt" not in strong.table(fit=False) and "serial fraction" not in strong.table(fit=False)
    weak = scaling.Scaling("backprop", "weak", 1024, [1, 2], [Timing([1.0]), Timing([1.1])],
                           serial_timings=[Timing([1.0]), Timing([2.0, 2.2])])
    assert weak.one_rank_times.tolist() == [1.0, 2.1]
    with pytest.raises(ValueError, match="weak-scaling"):
        _ = strong.one_rank_times


@pytest.mark.parametrize("wrong, match", [
    (wire_step(compute=lambda t1, p, cores: t1 / p), "past the cores, ranks take turns"),
    (wire_step(block=lambda nbytes, p: nbytes), "carries nbytes / p"),
    (wire_step(messages=lambda p: p - 1), "half the ring"),
    (wire_step(latency=False), "pays the latency alpha"),
    (wire_step(messages=lambda p: 2 * max(p - 1, 1)), "no allreduce at p = 1"),
    (wire_step(compute=lambda t1, p, cores: t1), "the compute divides between the ranks"),
    (lambda t1, ranks, cores, alpha, beta, nbytes: float(wire_step()(t1, ranks, cores, alpha, beta, nbytes)[0]),
     "expected an array"),
])
def test_wire_step_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.wire_step(wrong)
