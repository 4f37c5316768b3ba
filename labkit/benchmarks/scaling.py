"""``labkit bench scaling [--quick] [--json]``: strong and weak scaling of the data-parallel step on 1..4 ranks, and
the serial fraction fitted on a workload whose serial fraction is known (the runners are :mod:`labkit.scaling`)."""

from __future__ import annotations

import time

from ..machine import machine_info
from ..scaling import Scaling, strong_scaling, weak_scaling


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Strong and weak scaling of the data-parallel step, and the synthetic workload's fitted serial fraction; every
    rank count's runs repeated in interleaved rounds (3, 1 with ``quick``) and their times pooled."""
    ranks = (1, 2) if quick else (1, 2, 3, 4)
    repeat = 5 if quick else 9
    rounds = (1 if quick else 3) if rounds is None else rounds
    strong = strong_scaling("backprop", ranks, repeat=repeat, progress=progress, rounds=rounds)
    weak = weak_scaling("backprop", ranks, repeat=repeat, progress=progress, rounds=rounds)
    synth = strong_scaling("synthetic", (1, 2), repeat=repeat, progress=progress, rounds=rounds)
    i2 = strong.ranks.index(2)
    return {
        "benchmark": "scaling", "quick": quick, "rounds": rounds,
        "backprop_strong": strong.to_dict(), "backprop_weak": weak.to_dict(), "synthetic_strong": synth.to_dict(),
        "backprop_strong_speedup_p2": float(strong.speedup[i2]),
        "backprop_weak_scaled_speedup_p2": float(weak.speedup[weak.ranks.index(2)]),
        "backprop_weak_efficiency_p2": float(weak.weak_efficiency[weak.ranks.index(2)]),
        "backprop_serial_fraction_amdahl": strong.serial_fraction,
        "backprop_serial_fraction_gustafson": weak.serial_fraction,
        "synthetic_serial_fraction_set": 0.1, "synthetic_serial_fraction_fitted": synth.serial_fraction,
        "machine": machine_info(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def report(result: dict) -> str:
    """A summary for people."""
    cores = result.get("machine", {}).get("cpus", "?")
    parts = [f"scaling benchmark ({'quick' if result['quick'] else 'full'}), {cores} cores, 1 BLAS thread per rank"]
    for key in ("backprop_strong", "backprop_weak", "synthetic_strong"):
        parts.append(Scaling.from_dict(result[key]).table())
    parts.append(f"synthetic workload: serial fraction set {result['synthetic_serial_fraction_set']}, "
                 f"fitted {result['synthetic_serial_fraction_fitted']:.3f}")
    return "\n\n".join(parts)
