"""Every ``LABKIT_*`` environment variable, read in one place, each by one typed reader.

A setting is read when it is used (not at import), so a notebook or a test may change it at run time.
A value that cannot be understood raises :class:`SettingError` naming the variable and what it accepts,
instead of being silently taken as the default. ``labkit doctor`` and the table in docs/instructors.md
list them all (:func:`table`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import LabkitError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")
DEVICES = ("auto", "cpu", "gpu")


class SettingError(LabkitError, ValueError):
    """An environment variable holds a value labkit cannot use."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # "bool", "float", "int", "path", "choice", "text"
    default: object
    help: str
    choices: tuple[str, ...] = ()


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("LABKIT_DATA", "path", None, "a folder holding mnist/ and fashion-mnist/ (searched after an explicit root=)"),
    Setting("LABKIT_MIRROR", "text", None, "a URL to fetch the data sets from instead of the built-in mirrors"),
    Setting("LABKIT_DEVICE", "choice", "auto", "cpu forces NumPy and the kernel emulator; gpu demands a working CUDA device",
            DEVICES),
    Setting("LABKIT_PROGRESS", "bool", None, "1 or 0 draws or hides every progress bar (default: tqdm's choice, "
            "off where output is not a terminal or a notebook; TQDM_DISABLE=1 also hides them)"),
    Setting("LABKIT_MPI_TIMEOUT", "float", None, "seconds a collective waits for a peer before TimeoutError "
            "(MPICluster sets it on its engines)"),
    Setting("LABKIT_CACHE", "path", None, "where compiled kernels are kept (default ~/.cache/labkit)"),
    Setting("LABKIT_CHECKED", "bool", False, "run labkit's own kernels in the emulator's checked mode (bounds checks)"),
    Setting("LABKIT_KERNEL_TIMEOUT", "float", 120.0, "seconds an emulated kernel in checked mode may run"),
    Setting("LABKIT_EMU_THREADS", "int", None, "OS threads an emulated launch spreads its blocks over "
            "(default: the usable cores)"),
    Setting("LABKIT_EMU_UCONTEXT", "bool", False, "switch the emulator's fibers with ucontext instead of its own "
            "assembly (slower; for debugging)"),
    Setting("LABKIT_EMU_STACK_KB", "int", 64, "stack of each emulated CUDA thread, in KiB (at least 16)"),
    Setting("LABKIT_CHROMIUM", "path", None, "tests: the Chromium the JupyterLab browser test drives"),
    Setting("LABKIT_REQUIRE_BROWSER", "bool", False, "tests: fail instead of skipping the browser test without Chromium"),
    Setting("LABKIT_REQUIRE_HOSTS", "bool", False, "tests: fail instead of skipping the several-hosts tests where "
            "namespace hosts cannot be made"),
    Setting("LABKIT_SHAPED_HOSTS", "bool", True, "0 keeps the labs' experiments on a network that costs (lab 12's "
            "section 9) on this machine instead of namespace hosts with shaped cables (labkit.network)"),
    Setting("LABKIT_REQUIRE_SLURM", "bool", False, "tests: fail instead of skipping the SLURM tests where a test "
            "SLURM cluster cannot be made or started"),
    Setting("LABKIT_REQUIRE_SANDBOX", "bool", False, "tests: fail instead of skipping the sandboxed grading tests "
            "without bubblewrap"),
    Setting("LABKIT_SANDBOX", "choice", "auto", "how labkit grade isolates each notebook: bubblewrap's namespaces, or "
            "(where they cannot be made, and the grader is root) an unprivileged user of its own; auto: bubblewrap "
            "where it runs, else that user", ("auto", "bubblewrap", "user")),
    Setting("LABKIT_TEST_RUN", "str", None, "tests: set by the test suite on itself and what it starts, so that its "
            "check for what was left behind passes over another test run's processes"),
    Setting("LABKIT_BIND_ADDRESS", "str", None, "set by run_mpi for a job across hosts: the address mpiexec listens "
            "on, the one the other hosts reach this machine by (not every interface)"),
    Setting("LABKIT_MPI_JOB", "str", None, "set by run_mpi on every process of a job, so that none outlives it (its "
            "host cut off, say)"),
    Setting("LABKIT_CAPTURE", "path", None, "set by labkit grade in the graded notebook: the folder its checks record "
            "the student's results into"),
    Setting("LABKIT_CHECK_SEED", "int", 0, "set by labkit grade: the offset of the checks' input seeds, drawn afresh "
            "for every submission"),
    Setting("LABKIT_HIDDEN_PARTS", "str", None, "set by labkit grade --hidden-part: the exercises (or all) whose "
            "checks also run, silently, on a second secret draw, the hidden part"),
    Setting("LABKIT_HIDDEN_SEED", "int", 0, "set by labkit grade --hidden-part: the offset of the hidden parts' "
            "input seeds"),
)}


def _raw(name: str) -> str | None:
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a labkit setting; known: {', '.join(SETTINGS)}")
    value = os.environ.get(name)
    return None if value is None else value.strip()


def in_force() -> dict[str, str]:
    """The labkit settings set in this environment, as their raw text."""
    return {name: os.environ[name] for name in SETTINGS if name in os.environ}


def _bad(name: str, value: str, wanted: str) -> SettingError:
    return SettingError(f"{name}={value!r} is not understood: expected {wanted} "
                        f"({SETTINGS[name].help}); unset it for the default")


def get(name: str):
    """The value of setting ``name``, parsed by its kind; the default when unset or empty."""
    s = SETTINGS.get(name)
    raw = _raw(name)
    if raw is None or raw == "":
        return s.default
    if s.kind == "bool":
        low = raw.lower()
        if low in TRUE:
            return True
        if low in FALSE:
            return False
        raise _bad(name, raw, f"one of {', '.join(TRUE)} or {', '.join(v for v in FALSE if v)}")
    if s.kind in ("float", "int"):
        try:
            value = float(raw) if s.kind == "float" else int(raw)
        except ValueError:
            raise _bad(name, raw, f"a positive {'number' if s.kind == 'float' else 'whole number'}") from None
        if value <= 0:
            raise _bad(name, raw, "a positive number")
        return value
    if s.kind == "choice":
        low = raw.lower()
        if low == "cuda":  # an alias people type
            low = "gpu"
        if low not in s.choices:
            raise _bad(name, raw, f"one of {', '.join(s.choices)}")
        return low
    if s.kind == "path":
        return Path(raw).expanduser()
    return raw


# -- one typed reader per setting ------------------------------------------------------------------


def data_dir() -> Path | None:
    return get("LABKIT_DATA")


def mirror() -> str | None:
    return get("LABKIT_MIRROR")


def device() -> str:
    """"auto", "cpu" or "gpu"."""
    return get("LABKIT_DEVICE")


def progress() -> bool | None:
    """True or False when LABKIT_PROGRESS says so, else None (let tqdm decide)."""
    return get("LABKIT_PROGRESS")


def mpi_timeout() -> float | None:
    return get("LABKIT_MPI_TIMEOUT")


def cache_dir() -> Path:
    """Where labkit caches compiled code: $LABKIT_CACHE, else $XDG_CACHE_HOME/labkit or ~/.cache/labkit."""
    root = get("LABKIT_CACHE")
    if root is not None:
        return root
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "labkit"


def checked() -> bool:
    return get("LABKIT_CHECKED")


def kernel_timeout() -> float:
    return get("LABKIT_KERNEL_TIMEOUT")


def emu_threads() -> int | None:
    return get("LABKIT_EMU_THREADS")


def emu_ucontext() -> bool:
    return get("LABKIT_EMU_UCONTEXT")


def emu_stack_kb() -> int:
    return max(16, get("LABKIT_EMU_STACK_KB"))


def chromium() -> Path | None:
    return get("LABKIT_CHROMIUM")


def require_browser() -> bool:
    return get("LABKIT_REQUIRE_BROWSER")


def table() -> str:
    """The settings as a Markdown table (docs/instructors.md's is checked against it)."""
    rows = ["| variable | default | what it does |", "| --- | --- | --- |"]
    for s in SETTINGS.values():
        default = "unset" if s.default is None else str(s.default).lower() if s.kind == "bool" else str(s.default)
        rows.append(f"| `{s.name}` | {default} | {s.help} |")
    return "\n".join(rows)
