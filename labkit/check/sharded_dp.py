"""The checks of lab 13's exercises (memory per rank: ZeRO, fully sharded data parallelism and activation
checkpointing): ``bytes_per_rank``, the bytes a rank holds for each kind of training state at each of ZeRO's stages.
"""

from __future__ import annotations

import numpy as np

from .. import sharded_dp
from . import capture
from .common import call, each_case, fail, passed, recorded
from .exercises import Exercise

KINDS = sharded_dp.KINDS[:3]  # parameters, gradients, optimizer: what ZeRO's stages shard (activations are apart)
STAGE_NUMBER = {"dp": "plain data parallelism", "zero1": "stage 1", "zero2": "stage 2", "zero3": "stage 3"}


def _cases() -> list:
    """(psi, ranks, stage) of every case: each stage on 1, 4 and 64 ranks for the ZeRO paper's 7.5 billion parameters,
    an odd size on 3 ranks, and one drawn afresh whenever a notebook is graded."""
    rng = np.random.default_rng(capture.seed(131))
    fixed = [(7.5e9, p, s) for s in sharded_dp.STAGES for p in (64, 4, 1)] + [(1_000_003, 3, "zero2")]
    drawn = (float(rng.integers(1_000, 10**10)), int(rng.integers(2, 257)), str(rng.choice(list(sharded_dp.STAGES))))
    return fixed + [drawn]


def _want(psi: float, ranks: int, stage: str) -> dict:
    return sharded_dp.memory_per_rank(psi, ranks, stage, weight_bytes=2, state_bytes=12)


@recorded
def bytes_per_rank(fn) -> None:
    """Exercise (lab 13): ``fn(psi, ranks, stage)``, a dict of the bytes one rank holds of the parameters, the
    gradients and the optimizer state of mixed-precision Adam (fp16 weights and gradients, fp32 master weights and
    moments) for ``psi`` parameters on ``ranks`` ranks, at ``stage`` "dp", "zero1", "zero2" or "zero3"; to 1e-9."""
    ex = "bytes per rank"
    fn = capture.student(fn, "fn", ex)
    cases = _cases()
    for psi, ranks, stage in each_case(cases):
        where = f"psi = {psi:,.0f} parameters on {ranks} ranks, {stage}"
        got = call(ex, fn, psi, ranks, stage, where=where, hint="")
        if not isinstance(got, dict) or not set(KINDS) <= set(got):
            fail(ex, f"{where}: expected a dict with the keys {', '.join(KINDS)}, got {type(got).__name__}"
                 + (f" with the keys {sorted(got)}" if isinstance(got, dict) else ""),
                 "return {'parameters': ..., 'gradients': ..., 'optimizer': ...}, each a number of bytes")
        want = _want(psi, ranks, stage)
        for kind in KINDS:
            try:
                value = float(got[kind])
            except (TypeError, ValueError):
                fail(ex, f"{where}: {kind} is {got[kind]!r}, not a number of bytes")
            if not np.isclose(value, want[kind], rtol=1e-9, atol=0):
                _wrong(ex, where, kind, value, want[kind], ranks, stage)
    passed(ex, len(cases))


def _wrong(ex: str, where: str, kind: str, got: float, want: float, ranks: int, stage: str) -> None:
    """Fail a wrong number of bytes, naming its mistake where it is a known one (its own hint, no step spent)."""
    sharded = sharded_dp.STAGES[stage][KINDS.index(kind)]
    named = STAGE_NUMBER[stage]
    mistakes = []
    if ranks > 1 and sharded:
        mistakes.append((want * ranks, f"the whole {kind} on one rank", f"{named} splits the {kind} over the ranks: "
                         f"each of the {ranks} keeps its own 1/{ranks} of them"))
    if ranks > 1 and not sharded:
        mistakes.append((want / ranks, f"1/{ranks} of the {kind}", f"{named} keeps the whole {kind} on every rank: "
                         "only the stages from " + {"parameters": "3", "gradients": "2", "optimizer": "1"}[kind]
                         + " on split them"))
    if kind != "optimizer":
        mistakes.append((2 * want, "4 bytes per value", f"the {kind} are fp16, half precision: 2 bytes per value"))
    else:
        mistakes += [(want * 8 / 12, "8 bytes per parameter of state", "mixed-precision Adam keeps three fp32 values "
                      "per parameter: its two moments and the master copy of the weights the step updates"),
                     (want * 16 / 12, "16 bytes per parameter of state", "the fp16 weights and gradients are counted "
                      "apart, as parameters and gradients: the optimizer's state is its three fp32 values")]
    for value, what, hint in mistakes:
        if np.isclose(got, value, rtol=1e-9, atol=0):
            fail(ex, f"{where}: {kind}: yours is {got:,.6g} bytes, expected {want:,.6g}: that is {what}", hint)
    fail(ex, f"{where}: {kind}: yours is {got:,.6g} bytes, expected {want:,.6g}")


EXERCISES = (
    Exercise("bytes_per_rank", "13", references=("labkit.sharded_dp:memory_per_rank",), hints=(
        "Start with one rank and plain data parallelism: how many bytes does one parameter cost as a weight, as a "
        "gradient, and in the optimizer's state? Multiply each by psi.",
        "The optimizer's state per parameter: which values does mixed-precision Adam keep beside the fp16 weight and "
        "gradient, and in which precision? Add their bytes.",
        "Each stage splits some kinds over the ranks: a split kind costs each rank 1/ranks of its bytes, a kept one "
        "all of them. Which kinds does stage 1 split? Stage 2? Stage 3?",
        "By hand: 8 parameters on 4 ranks at stage 2. The weights stay whole, 8 x 2 = 16 bytes; the gradients are "
        "split, 16 / 4 = 4 bytes. What does the optimizer's state cost that rank?",
    )),
)
