"""Wheels for a GPU node without a network: ``make wheelhouse`` where there is one, ``make gpu-check`` on the node.

The compute nodes of many HPC centres cannot reach PyPI, and neither can some lab machines; they often have a CUDA
Python stack already (CuPy for CUDA 12 or 13, ``cupy-cuda12x`` or ``cupy-cuda13x``, next to PyTorch). On a machine
with a network::

    make wheelhouse WHEEL_PYTHON=3.12 WHEEL_PLATFORM=manylinux_2_28_x86_64

downloads into ``wheelhouse/`` every wheel that labkit and the GPU check need, for that Python and platform, CuPy
left out. Copy the checkout with it to the node. There ``make gpu-check`` makes ``.venv`` seeing the node's own
packages (``--system-site-packages``) and installs from the wheelhouse alone (``pip --no-index --find-links``),
keeping whichever ``cupy-cuda1Nx`` the node has. ``labkit gpu-check --plan`` (or ``python -m labkit.wheelhouse
plan``) says what it would install and from where. This module needs nothing but Python: it runs before labkit's
own dependencies are installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# of the test extra, what the GPU check runs (pytest with its time limits; hypothesis, which some test modules import)
GPU_CHECK_TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis")
BUILD = ("setuptools>=77", "wheel")  # an editable install builds labkit itself
CUPY_ONLINE = "cupy-cuda12x[ctk]>=14.0"  # what the GPU extra installs where no CuPy is present


def pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError as e:
            raise RuntimeError("reading pyproject.toml on Python 3.10 needs tomli: pip install tomli") from e
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def requirements() -> list[str]:
    """What a GPU node needs from the wheelhouse: labkit's dependencies with MPI as a wheel, the test tools the GPU
    check runs, and what building labkit itself takes. No CuPy (the node has its own)."""
    project = pyproject()
    return [*project["dependencies"], *project["optional-dependencies"]["mpi"], *_test_tools(), *BUILD]


def _test_tools() -> list[str]:
    """The requirements of the test extra that the GPU check runs (with the test extra's version bounds)."""
    return [r for r in pyproject()["optional-dependencies"]["test"] if _name(r) in GPU_CHECK_TEST_TOOLS]


def cupy_among(names) -> str | None:
    """The installed CuPy's distribution name among ``names`` ("cupy-cuda13x", "cupy", ...), or None."""
    found = sorted(n for n in (_name(x) for x in names) if n == "cupy" or re.fullmatch(r"cupy-(cuda|rocm)[\w-]+", n))
    return found[0] if found else None


def installed_cupy(python: str | None = None) -> str | None:
    """The CuPy distribution installed for ``python`` (this interpreter by default), whichever CUDA it is built for."""
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):  # a venv's python links elsewhere
        return cupy_among(d.metadata["Name"] or "" for d in importlib.metadata.distributions())
    r = subprocess.run([python, "-c", "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] or '' "
                        "for d in m.distributions()))"], capture_output=True, text=True)
    return cupy_among(r.stdout.split()) if r.returncode == 0 else None


def install_commands(python: str, wheelhouse: Path | None = None, cupy: str | None = "auto") -> list[list[str]]:
    """The pip commands that make ``python``'s environment ready for the GPU check: from ``wheelhouse`` alone when
    given (no network), else from PyPI. ``cupy``: "auto" keeps an installed CuPy and adds the GPU extra's otherwise;
    None installs none (labkit's side only)."""
    pip = [python, "-m", "pip", "install", "--quiet"]
    # from the wheelhouse alone: no index, and (--isolated) no find-links or index from pip's configuration either
    where = ["--isolated", "--no-index", "--find-links", str(wheelhouse)] if wheelhouse else []
    commands = [[*pip, *where, "-e", f"{ROOT}[mpi]", *_test_tools()]]
    if cupy == "auto" and installed_cupy(python) is None:
        commands.append([*pip, *where, "cupy-cuda12x"] if wheelhouse else [*pip, CUPY_ONLINE, "nvidia-nccl-cu12"])
    return commands


def describe_plan(python: str, wheelhouse: Path | None, cupy: str | None = "auto") -> str:
    """In words, what ``install`` will do."""
    have = installed_cupy(python)
    source = (f"from {wheelhouse} alone (pip --no-index --find-links: no network needed)" if wheelhouse
              else "from PyPI (no wheelhouse/ here; `make wheelhouse` on a machine with a network makes one)")
    lines = [f"install into {python}, {source}:"]
    lines += [f"  {' '.join(c)}" for c in install_commands(python, wheelhouse, cupy)]
    if cupy is None:
        lines.append("CuPy: none installed (labkit's side only)")
    elif have:
        lines.append(f"CuPy: keeps the installed {have}")
    else:
        lines.append("CuPy: none installed, so the GPU extra's " + ("cupy-cuda12x (it must be in the wheelhouse)"
                                                                   if wheelhouse else CUPY_ONLINE))
    return "\n".join(lines)


def platform_tags(platform: str) -> list[str]:
    """A node's platform tag and the older ones its pip also accepts: ``manylinux_2_28_x86_64`` brings
    manylinux_2_17 ... 2_28 and the legacy manylinux2014, 2010 and 1 tags (pip matches ``--platform`` exactly)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{k}_{arch}" for k in range(glibc, 16, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for k, name in legacy.items() if k <= glibc and (arch == "x86_64" or k == 17)]


def download(out: Path, python_version: str | None = None, platforms: list[str] | None = None) -> int:
    """``pip download`` every wheel of :func:`requirements` into ``out``, for another Python and platform if given."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(out)]
    if python_version:
        cmd += ["--python-version", python_version, "--implementation", "cp"]
    for p in dict.fromkeys(tag for given in platforms or [] for tag in platform_tags(given)):
        cmd += ["--platform", p]
    cmd += requirements()
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def install(python: str, wheelhouse: Path | None, cupy: str | None = "auto") -> int:
    if wheelhouse is not None and not any(wheelhouse.glob("*.whl")):
        print(f"{wheelhouse} holds no wheels: run `make wheelhouse` on a machine with a network and copy it here",
              file=sys.stderr)
        return 2
    print(describe_plan(python, wheelhouse, cupy), flush=True)
    for cmd in install_commands(python, wheelhouse, cupy):
        r = subprocess.run(cmd)
        if r.returncode != 0:
            print(f"failed: {' '.join(cmd)}" + ("\nthe wheelhouse lacks a wheel this needs: make it again for this "
                                                "node's Python and platform" if wheelhouse else ""), file=sys.stderr)
            return r.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.wheelhouse", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="download the wheels a GPU node needs")
    d.add_argument("--out", default=str(ROOT / "wheelhouse"))
    d.add_argument("--python-version", help="the node's Python, e.g. 3.12 (default: this one)")
    d.add_argument("--platform", action="append", help="the node's platform tag(s), e.g. manylinux_2_28_x86_64")
    for name in ("install", "plan"):
        s = sub.add_parser(name, help="install for the GPU check" if name == "install" else "say what install would do")
        s.add_argument("--python", default=sys.executable)
        s.add_argument("--wheelhouse", help="install from this folder alone (no network)")
        s.add_argument("--no-cupy", action="store_true", help="install no CuPy (labkit's side only)")
    a = ap.parse_args(argv)
    if a.cmd == "download":
        return download(Path(a.out), a.python_version, a.platform)
    wh = Path(a.wheelhouse).resolve() if a.wheelhouse else None
    cupy = None if a.no_cupy else "auto"
    if a.cmd == "plan":
        print(describe_plan(a.python, wh, cupy))
        return 0
    return install(a.python, wh, cupy)


if __name__ == "__main__":
    sys.exit(main())
