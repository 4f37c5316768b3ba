"""The GPU check on a node without a network: the wheelhouse holds what the node lacks, the install reads it alone,
and a CuPy already on the node is kept whichever CUDA it is built for."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import wheelhouse

ROOT = Path(__file__).resolve().parent.parent


def _names(reqs):
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in reqs}


def test_the_wheelhouse_holds_labkits_needs_and_no_cupy():
    names = _names(wheelhouse.requirements())
    assert {"numpy", "matplotlib", "jupyterlab", "ipyparallel", "mpi4py", "mpich", "nbclient", "pytest",
            "pytest-timeout", "hypothesis", "setuptools", "wheel"} <= names
    assert not {n for n in names if n.startswith("cupy")}
    assert not names & {"playwright", "nbgrader", "ruff"}  # the GPU check runs none of these


@pytest.mark.parametrize("names, found", [
    (["numpy", "cupy-cuda13x", "torch"], "cupy-cuda13x"),
    (["cupy-cuda12x"], "cupy-cuda12x"),
    (["cupy_cuda11x"], "cupy-cuda11x"),
    (["cupy"], "cupy"),
    (["numpy", "cupyx-tools"], None),
])
def test_any_cupy_is_recognised(names, found):
    assert wheelhouse.cupy_among(names) == found


@pytest.fixture
def bare_venv(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    python = tmp_path / "v" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    return python, site


def test_an_installed_cupy_is_kept_and_a_missing_one_named(bare_venv, tmp_path):
    python, site = bare_venv
    house = tmp_path / "house"
    house.mkdir()
    plan = wheelhouse.install_commands(str(python), house)
    assert plan[-1][-1] == "cupy-cuda12x" and "--no-index" in plan[-1]  # none there: the wheelhouse must hold one
    assert "CuPy: none installed" in wheelhouse.describe_plan(str(python), house)
    info = site / "cupy_cuda13x-14.2.0.dist-info"  # what pip leaves for an installed cupy-cuda13x
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cupy-cuda13x\nVersion: 14.2.0\n")
    plan = wheelhouse.install_commands(str(python), house)
    assert len(plan) == 1 and not any(part.startswith("cupy") for part in plan[0])
    assert plan[0][3:8] == ["install", "--quiet", "--isolated", "--no-index", "--find-links"]
    assert "CuPy: keeps the installed cupy-cuda13x" in wheelhouse.describe_plan(str(python), house)


def test_an_empty_wheelhouse_is_refused_with_the_fix(tmp_path, capsys):
    (tmp_path / "house").mkdir()
    assert wheelhouse.main(["install", "--python", sys.executable, "--wheelhouse", str(tmp_path / "house")]) == 2
    assert "holds no wheels: run `make wheelhouse`" in capsys.readouterr().err


def test_the_gpu_check_plan_says_what_it_installs_and_from_where(capsys):
    from labkit import cli

    assert cli.main(["gpu-check", "--plan"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"install into {sys.executable}, from ")
    assert "CuPy: " in out and "1. doctor" in out


needs_root_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                        reason="blocking the network for one command needs root and unshare")


@pytest.mark.slow
@pytest.mark.hosts  # a network namespace (unshare)
@needs_root_unshare
def test_offline_install_from_a_wheelhouse_in_a_namespace_without_a_network(tmp_path):
    """Made here with a network; installed in a network namespace of its own (only a down loopback: pip cannot reach
    anything), into a fresh venv, from the wheelhouse alone; then labkit and its stack import there."""
    house = tmp_path / "house"
    r = subprocess.run([sys.executable, "-m", "labkit.wheelhouse", "download", "--out", str(house)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    venv = tmp_path / "node"
    offline = ["unshare", "--net", "--"]
    connect = "import socket; socket.create_connection(('151.101.0.223', 443), 5)"  # one of PyPI's addresses
    blocked = subprocess.run([*offline, sys.executable, "-c", connect], capture_output=True, text=True, timeout=60)
    assert blocked.returncode != 0 and "unreachable" in blocked.stderr  # the namespace really has no network
    r = subprocess.run([*offline, "sh", "-c", f"{sys.executable} -m venv {venv} && {venv}/bin/python -m labkit.wheelhouse "
                        f"install --python {venv}/bin/python --wheelhouse {house} --no-cupy"],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"from {house} alone" in r.stdout
    probe = tmp_path / "probe.py"  # what the GPU check imports, then its plan
    probe.write_text("import labkit, numpy, matplotlib, ipyparallel, nbclient, pytest, mpi4py\n"
                     "from labkit import cli\nraise SystemExit(cli.main(['gpu-check', '--plan']))\n")
    r = subprocess.run([*offline, str(venv / "bin" / "python"), str(probe)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1. doctor" in r.stdout


def test_a_node_platform_brings_the_older_tags_its_pip_accepts():
    tags = wheelhouse.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert wheelhouse.platform_tags("manylinux_2_17_aarch64") == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert wheelhouse.platform_tags("macosx_11_0_arm64") == ["macosx_11_0_arm64"]
