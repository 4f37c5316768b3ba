"""The house rules a reader relies on: no import cycle, no private name imported across modules, every setting read
in labkit.settings and listed in the README, conda and pip listing the same packages, the command's conventions."""

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import solutions

from labkit import gpucheck, labs, machine, progress, runner, settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "labkit"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(name: str, path: Path):
    """(module imported, name imported or None) for every import in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                yield target, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None


def test_no_import_cycle_and_no_private_name_across_modules():
    mods = _modules()
    graph, private = {m: set() for m in mods}, []
    for name, path in mods.items():
        for target, imported in _imports(name, path):
            full = f"{target}.{imported}" if imported else target
            dep = full if full in mods else target
            if dep in mods and dep != name:
                graph[name].add(dep)
            if imported and imported.startswith("_") and target.startswith("labkit") and not imported.startswith("__"):
                private.append(f"{name} imports {target}.{imported}")
    assert not private, private

    def cycle_from(start):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
        return None

    # a package importing its own submodules is not a cycle a reader trips over; module-to-module ones are
    cycles = [c for m in mods if (c := cycle_from(m)) and not any(a.startswith(b + ".") or b.startswith(a + ".")
                                                                    for a, b in zip(c, c[1:]))]
    assert not cycles, cycles


def test_no_private_attribute_of_another_labkit_module():
    modules = {m.rsplit(".", 1)[-1] for m in _modules()}
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in modules):
                found.append(f"{name}: {node.value.id}.{node.attr}")
    assert not found, found


def test_every_labkit_setting_is_read_only_in_settings():
    pattern = re.compile(r"(os\.environ(\.get)?\s*[\[(]\s*|getenv\s*\(\s*)[\"']LABKIT_")
    offenders = [str(f.relative_to(ROOT)) for f in list(PACKAGE.rglob("*.py")) + list(PACKAGE.rglob("*.h"))
                 if f.name != "settings.py" and pattern.search(f.read_text())]
    offenders += [str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("*.py")
                  if f.name != "test_packaging.py" and pattern.search(f.read_text())]
    assert not offenders, f"read LABKIT_* through labkit.settings: {offenders}"
    used = set(re.findall(r"LABKIT_[A-Z_]+", " ".join(f.read_text() for f in PACKAGE.rglob("*.py"))))
    # C macros of the emulator, not variables
    used -= {"LABKIT_EMU_CHECKED", "LABKIT_EMU_USE_UCONTEXT", "LABKIT_EMU_NO_WARPS", "LABKIT_EMU_COUNT"}
    assert used <= set(settings.SETTINGS), used - set(settings.SETTINGS)


def test_settings_parse_and_refuse(monkeypatch):
    monkeypatch.setenv("LABKIT_CHECKED", "yes")
    assert settings.checked() is True
    monkeypatch.setenv("LABKIT_CHECKED", "sometimes")
    with pytest.raises(settings.SettingError, match="LABKIT_CHECKED='sometimes' is not understood"):
        settings.checked()
    monkeypatch.setenv("LABKIT_DEVICE", "CUDA")
    assert settings.device() == "gpu"
    monkeypatch.setenv("LABKIT_DEVICE", "tpu")
    from labkit.kernels import backend

    with pytest.raises(settings.SettingError, match="LABKIT_DEVICE='tpu'"):
        backend()  # the kernel loader no longer takes a typo for "auto"
    monkeypatch.setenv("LABKIT_KERNEL_TIMEOUT", "-3")
    with pytest.raises(settings.SettingError, match="a positive number"):
        settings.kernel_timeout()
    monkeypatch.delenv("LABKIT_KERNEL_TIMEOUT")
    assert settings.kernel_timeout() == 120.0


def _requirement_names(reqs) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in reqs}


def test_environment_yml_and_pyproject_list_the_same_packages():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pip_side = _requirement_names(project["dependencies"] + extras["test"] + extras["mpi"])
    lines = (ROOT / "environment.yml").read_text().split("dependencies:", 1)[1].splitlines()
    conda = _requirement_names(ln.split("#")[0].strip()[2:] for ln in lines
                               if ln.startswith("  - ") and not ln.strip().startswith("- pip:"))
    conda -= {"python", "pip", "cxx-compiler", "c-compiler"}  # the environment itself, the emulator's and lab 03's compilers
    conda |= _requirement_names(ln.split("#")[0].strip()[2:].strip('"') for ln in lines  # what pip installs there
                                if ln.startswith("      - ") and ln.strip() != "- -e .")
    assert pip_side == conda, {"only in pyproject": pip_side - conda, "only in environment.yml": conda - pip_side}
    assert not any("mpich" in r for r in project["dependencies"]), "PyPI's mpich belongs in the [mpi] extra"


def test_constraints_pin_every_dependency():
    tomllib = pytest.importorskip("tomllib")
    pins = {ln.split("==")[0].lower().replace("_", "-") for ln in (ROOT / "constraints.txt").read_text().splitlines()
            if "==" in ln}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _requirement_names(project["dependencies"] + project["optional-dependencies"]["test"]
                                + project["optional-dependencies"]["mpi"])
    assert wanted <= pins, wanted - pins


def test_python_m_labkit_version_and_help():
    from labkit import __version__

    out = subprocess.run([sys.executable, "-m", "labkit", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"labkit {__version__}"
    helped = subprocess.run([sys.executable, "-m", "labkit", "lab", "--help"], capture_output=True, text=True, timeout=60)
    assert "passed on to\nJupyterLab" in helped.stdout or "passed on to JupyterLab" in helped.stdout.replace("\n", " ")


def test_progress_follows_tqdm_conventions(monkeypatch):
    monkeypatch.delenv("LABKIT_PROGRESS", raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert progress.progress_bar(range(3)).disable  # pytest's output is no terminal: no bar
    monkeypatch.setenv("LABKIT_PROGRESS", "1")
    assert not progress.progress_bar(range(3)).disable  # an explicit setting wins
    assert progress.progress_bar(range(3), enable=False).disable  # and the caller's choice over it
    monkeypatch.delenv("LABKIT_PROGRESS")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress.progress_bar(range(3)).disable


def test_usable_cores_read_the_cgroup_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert machine.cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert machine.cgroup_quota(tmp_path) is None
    assert 1 <= machine.usable_cores() <= (len(__import__("os").sched_getaffinity(0)))


def test_gpu_check_plan_and_refusal(tmp_path):
    steps = gpucheck.plan(tmp_path)
    names = [s.name for s in steps]
    assert names == ["doctor", "gpu-tests", "bench-kernels", "speed-of-light", "lab04-full", "lab05-full"]
    text = gpucheck.describe(steps)
    assert "-m gpu" in text and "bench kernels --json" in text and "--profile full --only 04_" in text
    assert all(str(tmp_path) in " ".join(s.argv) for s in steps[1:])  # everything is written into one folder
    from labkit.device import gpu_status

    if gpu_status()[0]:
        pytest.skip("a GPU is usable here: the refusal cannot be seen")
    out = subprocess.run([sys.executable, "-m", "labkit", "gpu-check", "--out", str(tmp_path / "g")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "needs a working CUDA GPU" in out.stderr
    assert not (tmp_path / "g").exists(), "nothing runs, nothing is written, without a GPU"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):  # the speed-of-light step, run by hand without one
        gpucheck.speed_of_light(tmp_path / "sol.json")


@pytest.mark.slow
def test_an_installed_wheel_ships_the_handouts_and_keeps_data_in_the_cache(tmp_path):
    """Outside a checkout (a wheel in site-packages): the labs are found inside the package as handouts, with no line
    of a worked solution or a model answer anywhere in the wheel (a graded notebook reads the installed package); data
    goes to the user's cache folder (never site-packages/data); the student versions can be written, and the report,
    which needs the solutions, says where they are."""
    wheels, site, home = tmp_path / "wheels", tmp_path / "site", tmp_path / "home"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # from a copy of the checkout's own files: a build/ folder left by an earlier build would add stale files
    source = tmp_path / "source"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    for name in listed.stdout.split():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    built = subprocess.run(pip + ["wheel", "--no-deps", "-w", str(wheels), str(source)], capture_output=True, text=True,
                           timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(wheels.glob("labkit-*.whl"))
    found, _ = solutions.search([str(wheels)])
    assert found == {}, f"the wheel holds lines of the worked solutions: {found}"
    found, _ = solutions.search([str(ROOT / "notebooks")])
    assert len(found) == len(runner.find_notebooks()), "the search finds the solutions where they are"
    done = subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    code = ("import labkit, labkit.report as r, labkit.data as d, labkit.grading.assign as a\n"
            "nbs = r.find_notebooks()\n"
            "print(labkit.__file__, len(nbs), d.REPO_DATA, d.default_dir())\n"
            f"print(len(a.write_student_versions(nbs[:1], {str(tmp_path / 'student')!r})))\n"
            "print(d.locate().kind, d.verify(), d.load_mnist(verify=False)[0][0].shape)\n"
            "import labkit.openmp as o\nprint(o.SOURCE.is_file(), o.HELPERS.is_file())\n"
            "import pkgutil\nprint(*sorted(m.name for m in pkgutil.walk_packages(labkit.__path__, 'labkit.')))\n"
            "import json, labkit.handout as h\nprint(all(h.is_handout(json.loads(p.read_text())) for p in nbs))\n"
            "try:\n    r.run(out='report', fetch=False)\nexcept labkit.runner.NoSolutions as e:\n    print(e)\n"
            "import labkit.cli as c\ntry:\n    c.work_copies(r.NOTEBOOKS, __import__('pathlib').Path('sol'), True)\n"
            "except labkit.runner.NoSolutions as e:\n    print(e)\n"
            "print(len(c.work_copies(r.NOTEBOOKS, __import__('pathlib').Path('work'))))\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(site), "HOME": str(home)}
    env.pop("XDG_CACHE_HOME", None)
    env.pop("LABKIT_CACHE", None)
    env.pop("LABKIT_DATA", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second, third, fourth, fifth, sixth, seventh, eighth, ninth = out.stdout.split("\n")[:9]
    where, count, repo_data, default = first.split()
    assert where.startswith(str(site)) and count == str(len(runner.find_notebooks())) and repo_data == "None"
    assert default == str(home / ".cache" / "labkit" / "data") and second == "1"
    kind, subset, shape = third.split(" ", 2)
    assert kind == "subset" and subset.startswith(str(site)) and shape == "(10000, 784)", "the MNIST subset ships too"
    assert fourth == "True True", "the C sources of the OpenMP lab ship too"
    import labkit
    here = sorted(m.name for m in pkgutil.walk_packages(labkit.__path__, "labkit."))
    assert fifth.split() == here, f"the wheel's modules differ from the checkout's: {set(here) ^ set(fifth.split())}"
    assert sixth == "True", "every notebook in the wheel is a handout"
    assert "labkit report needs the instructor's notebooks" in seventh and "--notebooks DIR" in seventh, seventh
    assert not (tmp_path / "report").exists(), "nothing runs on the handouts"
    assert "labkit lab --solutions needs the instructor's notebooks" in eighth and not (tmp_path / "sol").exists()
    handed = sum(not labs.is_draft(p.name) for p in runner.find_notebooks())  # a lab being written is not handed out
    assert ninth == str(handed), "labkit lab hands out every lab from the installed handouts"
