"""``labkit gpu-check``: everything the GPU half of the course needs checked, in one run on a CUDA machine.

Lab machines with GPUs are lent for minutes, so those minutes go to running, not preparing: ``make gpu-check``
installs the GPU extra and calls this, which runs, one after another, each step of :func:`plan` (doctor, every
test marked ``gpu``, the kernel benchmark, each lab kernel's measured time over its speed of light on this GPU, labs
04 and 05 on the full profile), keeps going when one fails, and
writes every log, the benchmark JSON, the executed notebooks and ``summary.json`` into one folder. Without a
usable GPU it refuses, saying why, before running anything; ``--plan`` prints the steps anywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .device import gpu_status
from .kernels import measure
from .machine import machine_info

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    timeout: float  # seconds


def plan(out: Path) -> list[Step]:
    """The steps, in order, with the command each runs and where it writes."""
    py = sys.executable
    tests = ROOT / "tests"
    steps = [Step("doctor", [py, "-m", "labkit", "doctor"], 300)]
    if tests.is_dir():  # a checkout: the GPU tests too (an installed package has none)
        steps.append(Step("gpu-tests", [py, "-m", "pytest", str(tests), "-m", "gpu", "-rA", "-p", "no:cacheprovider",
                                        f"--junitxml={out / 'gpu-tests.xml'}"], 1800))
    steps += [
        Step("bench-kernels", [py, "-m", "labkit", "bench", "kernels", "--json", "--out", str(out / "bench-kernels.json")],
             1200),
        Step("speed-of-light", [py, "-c", "import sys; from labkit.gpucheck import speed_of_light; speed_of_light(sys.argv[1])",
                                str(out / "speed-of-light.json")], 900),
        Step("lab04-full", [py, "-m", "labkit", "report", "--profile", "full", "--only", "04_",
                            "--out", str(out / "lab04")], 1800),
        Step("lab05-full", [py, "-m", "labkit", "report", "--profile", "full", "--only", "05_",
                            "--out", str(out / "lab05")], 1800),
    ]
    return steps


def speed_of_light(path: Path | str) -> list[dict]:
    """The speed-of-light step: every kernel :func:`labkit.kernels.measure.against_model` times, measured beside its
    modelled time on this GPU, written to ``path`` (JSON) and printed; run() puts the rows into summary.json."""
    rows = measure.against_model()
    Path(path).write_text(json.dumps(rows, indent=2) + "\n")
    for r in rows:
        print(f"{r['kernel']}: measured {r['measured_s'] * 1e6:.1f} µs, modelled at least {r['modelled_s'] * 1e6:.1f} µs "
              f"(set by {r['bound_by']}) on {r['gpu']}: {r['measured_over_modelled']:.2f}x")
    return rows


def describe(steps: list[Step]) -> str:
    """The plan, one line per step, as ``--plan`` prints it."""
    return "\n".join(f"{i}. {s.name} (at most {s.timeout / 60:g} min): {' '.join(s.argv)}" for i, s in enumerate(steps, 1))


def refusal() -> str | None:
    """Why the GPU check cannot run here (None when a CUDA device works)."""
    ok, why = gpu_status()
    if ok:
        return None
    return (f"labkit gpu-check needs a working CUDA GPU, and this machine has none usable: {why}. Run it on a "
            "machine with an NVIDIA GPU and driver, after `make gpu-check` (or `pip install -e '.[gpu]'`) has installed "
            "CuPy; `labkit gpu-check --plan` lists what it would run.")


def run(out: Path | str = "gpu-check", only: list[str] | None = None) -> dict:
    """Run the plan (or the steps named in ``only``) and write ``out/summary.json``; return the summary."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = [s for s in plan(out) if not only or s.name in only]
    summary = {"gpu": gpu_status()[1], "machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
               "steps": []}
    for s in steps:
        log = out / f"{s.name}.log"
        print(f"[gpu-check] {s.name}: {' '.join(s.argv)}", flush=True)
        t0 = time.monotonic()
        with log.open("w") as f:
            try:
                rc = subprocess.run(s.argv, stdout=f, stderr=subprocess.STDOUT, timeout=s.timeout, cwd=ROOT).returncode
            except subprocess.TimeoutExpired:
                rc = 124
                f.write(f"\n[gpu-check] stopped after {s.timeout:g} s\n")
        seconds = round(time.monotonic() - t0, 1)
        summary["steps"].append({"name": s.name, "returncode": rc, "seconds": seconds, "log": log.name})
        print(f"[gpu-check] {s.name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {seconds:g} s, log {log}", flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")  # after every step: a cut run keeps it
    summary["ok"] = all(s["returncode"] == 0 for s in summary["steps"])
    if (out / "speed-of-light.json").exists():  # measured over modelled time, kernel by kernel
        summary["speed_of_light"] = json.loads((out / "speed-of-light.json").read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
