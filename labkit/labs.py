"""The course's twelve labs, each declared once: its notebook, the lesson modules it teaches with, the check modules
that hold its exercises, what its text claims its run shows, and what it needs of the machine.

    >>> labs.get("07").notebook
    '07_ring_allreduce.ipynb'

Everything that lists the labs reads this: the README's and the docs' tables (:func:`table`), ``labkit labs``, the
layering test (a lesson module may not import the checks or the grader), the exercise registry (each exercise's lab
is one of these), the claims test and the ``labNN`` test markers. A test fails when a lesson module, a check module
or a notebook is not declared here.

Adding a lab: ``labkit labs new NN slug "Title"`` (:mod:`labkit.scaffold`) writes its skeleton, declared here as a
draft; CONTRIBUTING.md ("Adding a lab") says what to fill in. A draft (``draft=True``) is held to the lessons' form but
not yet to their counts (tests/test_lessons.py), and left out of the report's default run; finishing the lab is
deleting that flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .check import exercises
from .errors import LabkitError

# the lab notebooks: notebooks/ of a checkout, else the copy a wheel ships inside the package
NOTEBOOKS = next((d for d in (Path(__file__).resolve().parent.parent / "notebooks", Path(__file__).resolve().parent / "notebooks")
                  if d.is_dir()), Path(__file__).resolve().parent.parent / "notebooks")

# what a lab may need of the machine: an MPI launcher, namespace hosts with shaped cables (root, ip, tc), a C or C++
# compiler, a CUDA GPU
NEEDS = ("mpi", "hosts", "c", "gpu")


@dataclass(frozen=True)
class Lab:
    number: str                      # "01" ... "12": the notebook's prefix and the exercises' lab
    slug: str                        # the notebook's name after the number
    title: str                       # the notebook's heading after "Lab NN — "
    lessons: tuple[str, ...]         # the lesson modules of labkit it teaches with (a module may serve several labs)
    checks: tuple[str, ...]          # the modules of labkit.check holding its exercises
    claims: tuple[str, ...]          # what its text says its run shows, as the notebook checks it with labkit.claims.claim
    optional_claims: tuple[str, ...] = ()  # claims made only on some machines: a GPU, the emulator, shaped cables
    needs: tuple[str, ...] = ()      # of NEEDS: without these it cannot run
    uses: tuple[str, ...] = ()       # of NEEDS: it runs without these, and shows more with them
    draft: bool = False              # being written (labkit labs new): its form checked, not yet its counts

    @property
    def notebook(self) -> str:
        return f"{self.number}_{self.slug}.ipynb"

    @property
    def marker(self) -> str:
        """The pytest marker of its tests: ``pytest -m lab07``."""
        return f"lab{self.number}"


# the house around the lessons: the modules (and packages) of labkit that belong to no one lab
AROUND = ("__main__", "bench", "benchmarks", "check", "claims", "cli", "cluster", "doctor", "errors", "gpucheck", "grading",
          "handout", "labs", "machine", "native", "network", "plots", "progress", "questions", "report", "runner", "scaffold",
          "settings", "wheelhouse", "c", "mnist_subset")

# the lesson modules of a lab being written, not yet declared in LABS: held to the lessons' rules and tested like them,
# they move into their Lab's lessons when its notebook and checks are declared
COMING: dict[str, str] = {}  # module -> the lab it is for (lab 13's sharded_dp came in with its draft)


class UnknownLab(LabkitError, ValueError):
    """A lab number the course does not have."""


CABLE = "hosts"  # the claims across shaped cables are made only where namespace hosts can be made

LABS: tuple[Lab, ...] = (
    Lab("01", "serial_backprop", "Serial backpropagation on MNIST", ("data", "mlp"), ("serial",), (
        "per-sample and vectorised backprop end the first epoch at the same accuracy",
        "the vectorised epoch is faster",
        "a larger batch makes the epoch faster, up to a point",
        "the better network learns faster and further",
    )),
    Lab("02", "cpu_threads", "Backprop on several CPU cores: threads, the GIL, BLAS and processes",
        ("shards", "cpu_parallel"), ("serial",), (
            "two threads never compute at once on the narrowest layer (its samples are mostly Python, under the GIL)",
            "the process pool reaches the serial run's accuracy",
            "vectorising on one core was worth more than any number of these cores",
        )),
    Lab("03", "openmp_c", "The C program on the CPU: single-thread optimisation and OpenMP", ("hostc", "openmp"),
        ("openmp",), (
            "every C version computes NumPy's gradients (to float32 rounding)",
            "the compiler's optimisation matters: at -O2 the program executes fewer instructions than at -O0",
            "vector instructions (omp simd) make the single-thread version of fewest instructions",
            "the reduction is faster than omp critical, and omp critical faster than omp atomic",
            "per-sample backprop in C on one thread beats NumPy's per-sample loop",
        ), needs=("c",)),
    Lab("04", "gpu_offload", "Offloading backprop to a GPU: when do the copies pay for themselves?",
        ("device", "kernels"), ("offload",), (
            "batching on the device is faster than offloading per sample",
            "host and device training end in the same place",
        ), optional_claims=(
            "on the emulator offloading only adds work: no crossover",
            "offloading gains on wider layers",
            "copies from pinned memory are faster than from pageable memory",
            "two streams overlap the copies with the kernels",
        ), needs=("c",), uses=("gpu",)),
    Lab("05", "cuda_kernels", "Writing CUDA kernels: tiles, shared and constant memory, coalescing, atomics, warps",
        ("kernels",), ("kernels",), (
            "the naive kernel is bound by the L2 and the tiled one by shared memory",
            "the tiled kernel's loads touch 8 times fewer sectors than the naive one's",
            "a warp's loads touch 4 sectors in the coalesced copy and 32 in the strided one",
            "modelled, the coalesced copy is bound by DRAM and the strided one by the L2",
            "modelled, the strided copy is slower, by less than its 8x sectors",
        ), optional_claims=(
            "on the emulator the library convolution is faster than the fused kernel",
            "on a GPU the order is naive < tiled < register-blocked",
            "modelled on a GPU, the order is naive < tiled < register-blocked",
            "the block tree beats the atomics-only sum",
            "the block tree beats the atomics-only sum, modelled on a GPU",
            "each matmul sits at its own counted intensity, naive < tiled < register-blocked",
        ), needs=("c",), uses=("gpu",)),
    Lab("06", "mpi_collectives", "MPI collectives on ipyparallel engines", ("collectives", "traffic", "costmodel"),
        ("collectives",), (
            "the tree broadcast needs fewer rounds than the linear one, with the same p - 1 messages",
        ), needs=("mpi",)),
    Lab("07", "ring_allreduce", "Ring allreduce", ("collectives", "shards", "traffic", "costmodel"), ("ring",), (
        "the naive allreduce sends p(p-1)N elements in total and the ring 2(p-1)N, on every number of ranks",
        "at the largest size the ring, moving less data, is faster than the naive allreduce",
    ), optional_claims=(
        "across hosts with shaped cables the ring beats the naive allreduce at the largest size by at least 1.5x",
    ), needs=("mpi",), uses=(CABLE,)),
    Lab("08", "data_parallel_sgd", "Synchronous data-parallel SGD", ("comm_backends", "data_parallel"), ("data_parallel",), (
        "data parallelism trains as the serial run does: same accuracy, the same weights on every rank",
        "the synchronous runs train as one rank does",
        "no 2-process design beats the yardstick by more than the update it shares",
        "the overlapped step trains to the blocking step's weights",
        "across the cable the overlapped step trains to the blocking step's weights",
    ), optional_claims=(
        "across a 100 Mbit/s cable the allreduce of lab 08's step takes longer than its backprop",
    ), needs=("mpi",), uses=(CABLE,)),
    Lab("09", "parameter_servers", "Parameter servers: synchronous, asynchronous, sharded, and stale", ("param_server",),
        ("param_server",), (
            "one worker still handles lr 0.6",
            "at lr 0.6 the accuracy falls with the most workers",
            "at lr 0.1 every configuration trains",
            "the staleness grows with the workers, about W - 1",
            "a learning rate scaled by 1/W recovers the accuracy",
            "synchronous averaging trains at lr 0.6",
            "bounding the staleness alone does not shrink the step; with the step scaled it trains",
            "a second master leaves the mean staleness about the same",
            "bounded staleness with s = 0 lowers the mean staleness",
        ), needs=("mpi",)),
    Lab("10", "gradient_compression", "Gradient compression: fewer bytes per step", ("compression",), ("compression",), (
        "float16 and int8 cost almost no accuracy",
        "error feedback closes the top-k gap",
        "your top-k with error feedback trains as labkit's does",
    ), optional_claims=(
        "across a 100 Mbit/s cable top-k 1 % spends less time per step exchanging than the dense ring",
        "top-k with error feedback reaches dense's final accuracy in less wall-clock time across the cable",
    ), needs=("mpi",), uses=(CABLE,)),
    Lab("11", "model_pipeline_parallel", "Model and pipeline parallelism: split the network, not the data",
        ("model_parallel",), ("model_parallel",), (
            "neuron parallelism computes the serial epoch",
            "the bubble is smaller with 16 micro-batches than with one, and at no m over 2 points below the formula",
            "in the step modelled, the measured bubble is above the formula's for equal stages",
            "the pipeline computes the serial step",
        ), needs=("mpi",)),
    Lab("12", "speedup_plots", "Speedup, efficiency, Amdahl and Gustafson", ("scaling",), ("scaling",), (
    ), optional_claims=(
        "across 100 Mbit/s cables the step is slower on 2 and 4 hosts than on one",
    ), needs=("mpi",), uses=(CABLE,)),
    Lab("13", "sharded_dp", "Memory per rank: ZeRO, fully sharded data parallelism and activation checkpointing",
        ("sharded_dp",), ("sharded_dp",), (
            "the counts give the ZeRO paper's memory per GPU for 7.5 billion parameters on 64 GPUs",
        ), draft=True),
)


def get(number: str | int) -> Lab:
    """The lab numbered ``number`` ("07", "7" or 7)."""
    key = f"{int(number):02d}" if str(number).isdigit() else str(number)
    for lab in LABS:
        if lab.number == key:
            return lab
    raise UnknownLab(f"no lab {number!r}: the labs are {', '.join(lab.number for lab in LABS)}")


def of_notebook(name: str) -> Lab | None:
    """The lab whose notebook file is ``name`` (a path's name, e.g. "07_ring_allreduce.ipynb"), or None."""
    return next((lab for lab in LABS if lab.notebook == name), None)


def is_draft(notebook: str) -> bool:
    """Whether the notebook file ``notebook`` (a path's name) is a lab still being written."""
    lab = of_notebook(notebook)
    return lab is not None and lab.draft


def lessons() -> tuple[str, ...]:
    """Every lesson module, in teaching order (each where it is first taught)."""
    return tuple(dict.fromkeys(m for lab in LABS for m in lab.lessons))


TABLE_HEAD = "| lab | notebook | what it is about | needs |"  # the first line of each table, where new rows go below
WHERE_HEAD = "| lab | lessons | exercises | claims | its tests |"


def table(mark_drafts: bool = False) -> str:
    """The Markdown table of the finished labs (the README's and docs/labs.md's); with ``mark_drafts`` the labs still
    being written too, "(draft)" after their titles, as ``labkit labs`` shows them."""
    shown = [lab for lab in LABS if mark_drafts or not lab.draft]
    return "\n".join([TABLE_HEAD, "| --- | --- | --- | --- |"] + [table_row(lab, mark_drafts) for lab in shown])


def table_row(lab: Lab, mark_draft: bool = False) -> str:
    """One lab's row of :func:`table`."""
    needs = ", ".join(list(lab.needs) + [f"{u} (optional)" for u in lab.uses]) or "Python"
    title = f"{lab.title} (draft)" if mark_draft and lab.draft else lab.title
    return f"| {lab.number} | `{lab.notebook[:-6]}` | {title} | {needs} |"


def where_table() -> str:
    """CONTRIBUTING.md's table of where each lab lives: its lessons, its exercises by check module, its claims and the
    marker that runs its tests."""
    rows = [where_row(lab, [e.name for e in exercises.in_lab(lab.number)]) for lab in LABS]
    return "\n".join([WHERE_HEAD, "| --- | --- | --- | --- | --- |"] + rows)


def where_row(lab: Lab, names: list[str]) -> str:
    """One lab's row of :func:`where_table`, its exercises named ``names``."""
    checks = " and ".join(f"`check.{c}`" for c in lab.checks)
    lessons = ", ".join(f"`{m}`" for m in lab.lessons)
    claims = f"{len(lab.claims)}" + (f" (+{len(lab.optional_claims)} on some machines)" if lab.optional_claims else "")
    return f"| {lab.number} | {lessons} | {checks}: {', '.join(f'`{n}`' for n in names)} | {claims} | `pytest -m {lab.marker}` |"
