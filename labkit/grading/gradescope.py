"""Gradescope's autograder for one lab: a zip that installs labkit with no network and grades each submission.

    labkit gradescope --release R --lab 01 --out autograder.zip [--python-version 3.10] [--platform manylinux_2_35_x86_64]

Gradescope unzips the bundle into ``/autograder/source`` and runs its ``setup.sh`` once, as root, when it builds the
autograder's image; then, for every submission, it runs ``/autograder/run_autograder`` (a copy of the zip's) with the
student's files in ``/autograder/submission`` and their metadata in ``/autograder/submission_metadata.json``, and
reads ``/autograder/results/results.json``. The zip holds:

- ``setup.sh``: a virtual environment in ``/autograder/venv``, pip and labkit installed from ``wheels/`` alone (the
  wheel holds the handouts, no solution); bubblewrap installed where the image allows, and this folder closed to all
  but root, as grading falls back to an unprivileged user of its own where bubblewrap cannot run;
- ``wheels/``: labkit's own wheel, its dependencies (MPI included) and pip, for the Python and platform of Gradescope's
  image (this machine's by default; Gradescope's Ubuntu 22.04 image has Python 3.10 and glibc 2.35), with the
  backports that Python needs (pip evaluates markers for the Python it runs on, so they are added by name);
- ``release/``: the release record (and rubrics) of the lab alone;
- ``labkit-autograder.json``: the lab and the options of the run;
- ``run_autograder``: ``python -m labkit.grading.gradescope autograde``, which copies the submission into a class of
  one, writes the submission's time into a submissions CSV (``student,lab,file,submitted_at,lms,lms_user_id,
  lms_submission_id``) and runs ``labkit grade <dir> --release R --lab NN --submissions CSV --export gradescope``:
  the notebook goes to ``<dir>/<student>/`` (the CSV's ``student``), the lab is two digits, the time Gradescope's
  ``created_at`` with its timezone, and each test's score its points less any late penalty.

The deadline is Gradescope's, where its metadata gives one: the student's own ``due_date`` (an extension granted in
Gradescope), else the assignment's; it is passed to ``labkit grade`` as that student's extension (``--extensions``),
so it stands in for the release's deadline while the release's late policy (percent a day, days accepted) applies.

``AUTOGRADER_ROOT`` (default ``/autograder``) moves the whole tree, for a test.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .. import wheelhouse
from ..errors import LabkitError

ROOT = Path("/autograder")
CONFIG = "labkit-autograder.json"
SUBMISSIONS_FIELDS = ("student", "lab", "file", "submitted_at", "lms", "lms_user_id", "lms_submission_id")

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the image: labkit from the wheels in this zip alone (no network)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="${AUTOGRADER_ROOT:-/autograder}"
"${AUTOGRADER_PYTHON:-python3}" -m venv --without-pip "$root/venv"
pip_wheel="$(ls "$here"/wheels/pip-*.whl | head -n 1)"
"$root/venv/bin/python" "$pip_wheel/pip" install --quiet --isolated --no-index --find-links "$here/wheels" pip
"$root/venv/bin/python" -m pip install --quiet --isolated --no-index --find-links "$here/wheels" "labkit[mpi]"
"$root/venv/bin/python" -c "import labkit, nbclient, matplotlib; print('labkit', labkit.__version__, 'installed')"
# the sandbox: bubblewrap where the image can have it (a failed install is no error: labkit then grades each notebook
# as an unprivileged user of its own, which reads what any user may, so this folder, the release and its rubrics
# included, is closed to all but root)
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  { timeout 300 apt-get install -y -qq --no-install-recommends bubblewrap || { timeout 300 apt-get update -qq &&
    timeout 300 apt-get install -y -qq --no-install-recommends bubblewrap; }; } >/dev/null 2>&1 ||
    echo "no bubblewrap: each submission will run as an unprivileged user of its own"
fi
chmod -R go-rwx "$here"
"$root/venv/bin/python" -c "from labkit.grading import sandbox as s; print('sandbox:', s.DESCRIBED[s.kind()], s.available()[1])"
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission: /autograder/submission graded into /autograder/results/results.json
root="${AUTOGRADER_ROOT:-/autograder}"
exec "$root/venv/bin/python" -m labkit.grading.gradescope autograde --root "$root"
"""


class BundleError(LabkitError, ValueError):
    """The autograder bundle cannot be built as asked."""


def lab_notebooks(record: dict, lab: str) -> list[str]:
    """The released notebooks of lab ``lab`` ("01" or "1"): by the lab the release found in each, else by its file
    name; BundleError naming the labs there are when none matches."""
    from .assign import lab_number

    want = lab_number(lab)
    labs = {name: entry.get("lab") or lab_number(name) for name, entry in record["notebooks"].items()}
    found = [name for name, number in labs.items() if want is not None and number == want]
    if not found:
        held = ", ".join(f"{number} ({name})" for name, number in sorted(labs.items()))
        raise BundleError(f"no notebook of lab {lab!r} in the release (it holds {held}): give --lab as one of them")
    return found


def build(release: Path | str, lab: str, out: Path | str, wheels: Path | str | None = None,
          python_version: str | None = None, platforms: list[str] | None = None, timeout: int = 60) -> Path:
    """Write the autograder zip of lab ``lab`` of the release at ``release`` to ``out``; return its path. ``wheels``:
    a folder of wheels to ship as they are (labkit's own included); else they are downloaded for ``python_version``
    and ``platforms`` (this interpreter's by default) and labkit's wheel is built from this checkout."""
    from .grade import load_release

    record, _ = load_release(release)
    if record is None:
        raise BundleError("no release record: give --release, the folder `labkit assign --release DIR` wrote")
    names = lab_notebooks(record, lab)
    folder = Path(release) if Path(release).is_dir() else Path(release).parent
    mine = {**record, "notebooks": {n: record["notebooks"][n] for n in names}}
    from .assign import lab_number

    config = {"lab": lab_number(lab), "notebooks": names, "timeout_s": timeout}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="labkit-gradescope-") as tmp:
        house = Path(wheels) if wheels else download_wheels(Path(tmp) / "wheels", python_version, platforms)
        if not any(house.glob("pip-*.whl")) or not any(house.glob("labkit-*.whl")):
            raise BundleError(f"{house} lacks pip's or labkit's wheel: the bundle installs both from it")
        part = out.with_name(out.name + ".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            _script(z, "setup.sh", SETUP_SH)
            _script(z, "run_autograder", RUN_AUTOGRADER)
            z.writestr(CONFIG, json.dumps(config, indent=1) + "\n")
            z.writestr("release/release.json", json.dumps(mine, indent=1) + "\n")
            rubrics = folder / "rubrics.json"
            if rubrics.is_file():
                kept = {n: q for n, q in json.loads(rubrics.read_text(encoding="utf-8")).items() if n in names}
                z.writestr("release/rubrics.json", json.dumps(kept, indent=1) + "\n")
            for wheel in sorted(house.glob("*.whl")):
                z.write(wheel, f"wheels/{wheel.name}", compress_type=zipfile.ZIP_STORED)  # wheels are zips already
        part.replace(out)
    return out


def _script(z: zipfile.ZipFile, name: str, text: str) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o100755 << 16  # executable once unzipped
    info.compress_type = zipfile.ZIP_DEFLATED
    z.writestr(info, text)


def download_wheels(house: Path, python_version: str | None = None, platforms: list[str] | None = None) -> Path:
    """labkit's wheel built from this checkout, and every wheel it and its MPI extra need, and pip, in ``house``."""
    house.mkdir(parents=True, exist_ok=True)
    run = [sys.executable, "-m", "pip"]
    build = subprocess.run([*run, "wheel", "--no-deps", "--quiet", "-w", str(house),
                            str(wheelhouse.ROOT)], capture_output=True, text=True)
    if build.returncode != 0:
        raise BundleError(f"building labkit's wheel failed:\n{build.stderr[-2000:]}")
    project = wheelhouse.pyproject()
    cmd = [*run, "download", "--quiet", "--only-binary=:all:", "--dest", str(house)]
    if python_version:
        cmd += ["--python-version", python_version, "--implementation", "cp"]
    for tag in dict.fromkeys(t for given in platforms or [] for t in wheelhouse.platform_tags(given)):
        cmd += ["--platform", tag]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["mpi"], "pip"]
    for _ in range(8):  # each round adds what the wheels of the last one ask for on the target Python
        got = subprocess.run([*cmd, *wanted], capture_output=True, text=True)
        if got.returncode != 0:
            raise BundleError(f"downloading the wheels failed (a network is needed here, not on Gradescope):\n"
                              f"{got.stderr[-2000:]}")
        # pip evaluates environment markers for the Python it runs on, whatever --python-version says: a backport
        # that only an older Python needs (exceptiongroup below 3.11) is left out unless asked for by name
        wanted = missing_requirements(house, python_version or "{}.{}".format(*sys.version_info[:2]))
        if not wanted:
            return house
    raise BundleError(f"the wheels in {house} still lack {', '.join(wanted)} after 8 rounds of downloads")


def missing_requirements(house: Path, python_version: str) -> list[str]:
    """What the wheels in ``house`` require on Python ``python_version`` (their markers evaluated for it, with the
    extras asked for) that no wheel there provides, as requirements to download."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    wheels = {canonicalize_name(parse_wheel_filename(w.name)[0]): w for w in house.glob("*.whl")}
    requires = {w: [Requirement(line) for line in _requires_dist(wheel)] for w, wheel in wheels.items()}
    env = {"python_version": python_version, "python_full_version": python_version + ".0"}
    extras: dict[str, set[str]] = {"labkit": {"", "mpi"}}  # what is installed: labkit[mpi], and what it pulls in

    def active(w: str) -> list:
        return [r for r in requires.get(w, []) if r.marker is None
                or any(r.marker.evaluate({**env, "extra": e}) for e in extras.get(w, {""}))]

    grown = True
    while grown:  # the extras asked for by requirements that apply, until no more are
        grown = False
        for w in list(extras):
            for r in active(w):
                name, asked = canonicalize_name(r.name), {"", *r.extras}
                if not asked <= extras.get(name, set()):
                    extras[name] = extras.get(name, set()) | asked
                    grown = True
    missing = {}
    for w in extras:
        for r in active(w):
            if canonicalize_name(r.name) not in wheels:
                r.marker = None
                missing[canonicalize_name(r.name)] = str(r)
    return sorted(missing.values())


def _requires_dist(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = z.read(name).decode("utf-8", "replace") if name else ""
    return [line.split(":", 1)[1].strip() for line in text.split("\n\n")[0].splitlines()
            if line.startswith("Requires-Dist:")]


def submission_row(metadata: dict, lab: str, file: str) -> dict:
    """The submissions CSV's row for one file of a Gradescope submission, from its submission_metadata.json."""
    user = (metadata.get("users") or [{}])[0]
    return {"student": student_of(metadata), "lab": lab, "file": file, "submitted_at": _submitted_at(metadata),
            "lms": "gradescope", "lms_user_id": str(user.get("id", "")), "lms_submission_id": str(metadata.get("id", ""))}


def _submitted_at(metadata: dict) -> str:
    """The submission's time as labkit grade reads it (ISO 8601 with its timezone); "" (no late penalty, and the run
    says so) for a time it could not read, rather than no grade at all."""
    from .late import parse_time

    text = str(metadata.get("created_at") or "")
    try:
        return parse_time(text, "created_at").isoformat() if text else ""
    except ValueError as e:
        print(f"submission_metadata.json: {e}", file=sys.stderr)
        return ""


def student_of(metadata: dict) -> str:
    """The student a submission is graded as: the first user's email, else their id, else "student"."""
    user = (metadata.get("users") or [{}])[0]
    return str(user.get("email") or user.get("id") or "student")


def due_date(metadata: dict) -> str:
    """The deadline Gradescope sets for this submission: each member's own (an extension), else the assignment's; of a
    group's members the most generous, whatever order Gradescope lists them in; as ISO 8601. "" where it sets none or
    none that reads as a time (said on stderr): the release's deadline stands."""
    from .late import most_generous

    default = _due(metadata.get("assignment"), "assignment")
    users = metadata.get("users") or [{}]
    found = [_due(u.get("assignment"), f"users[{k}].assignment") or default for k, u in enumerate(users)]
    best = most_generous(d for d in found if d is not None)
    return best.isoformat() if best else ""


def _due(source: dict | None, where: str):
    """One due_date of the metadata as a time; None where there is none or it does not read as one (said)."""
    from .late import parse_time

    text = str((source or {}).get("due_date") or "")
    try:
        return parse_time(text, f"{where}.due_date") if text else None
    except ValueError as e:
        print(f"submission_metadata.json: {e}", file=sys.stderr)
        return None


def grade_command(subs: Path, release: Path, out: Path, lab: str, csv_path: Path, timeout: int,
                  extensions: Path | None = None) -> list[str]:
    """``labkit grade``'s arguments for the class of one: lab ``lab`` alone, late work from the submissions CSV (and
    Gradescope's deadline as an extension CSV), and Gradescope's results.json."""
    return ["grade", str(subs), "--release", str(release), "--lab", lab, "--submissions", str(csv_path),
            "--out", str(out), "--export", "gradescope", "--timeout", str(timeout)] + (
        ["--extensions", str(extensions)] if extensions else [])


def autograde(root: Path | str = ROOT) -> int:
    """``run_autograder``: grade ``root``/submission as the bundle's lab into ``root``/results/results.json. A run
    that gives no results still writes one, scoring 0 and saying why, for Gradescope to show."""
    root = Path(root)
    config = json.loads((root / "source" / CONFIG).read_text())
    meta_path = root / "submission_metadata.json"
    metadata = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    notebooks = sorted(p for p in (root / "submission").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not notebooks:
        return _failed(results, "no notebook (.ipynb) in the submission: upload your lab's .ipynb file")
    with tempfile.TemporaryDirectory(prefix="labkit-autograde-") as tmp:
        tmp = Path(tmp)
        student = student_of(metadata)
        folder = tmp / "subs" / _safe(student)
        folder.mkdir(parents=True)
        csv_path = tmp / "submissions.csv"
        with open(csv_path, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, SUBMISSIONS_FIELDS)
            w.writeheader()
            for nb in notebooks:
                shutil.copyfile(nb, folder / nb.name)
                w.writerow({**submission_row(metadata, config["lab"], nb.name), "student": _safe(student)})
        extensions = None
        if due := due_date(metadata):
            extensions = tmp / "extensions.csv"
            extensions.write_text(f"student,lab,deadline\n{_safe(student)},{config['lab']},{due}\n", encoding="utf-8")
        try:
            code = subprocess.run([sys.executable, "-m", "labkit", *grade_command(
                tmp / "subs", root / "source" / "release", tmp / "grades", config["lab"], csv_path,
                int(config.get("timeout_s", 60)), extensions)]).returncode
        except OSError as e:  # no Python where the bundle's was: Gradescope shows why
            return _failed(results, f"the grader stopped: {type(e).__name__}: {e}")
        made = tmp / "grades" / "results.json"
        if not made.is_file():
            return _failed(results, f"labkit grade exited {code} and wrote no results.json")
        shutil.copyfile(made, results)
    return 0


def _failed(results: Path, why: str) -> int:
    results.write_text(json.dumps({"score": 0.0, "output": why, "tests": []}, indent=1) + "\n")
    print(why, file=sys.stderr)
    return 1


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name) or "_"


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.grading.gradescope autograde [--root DIR]``: what run_autograder runs."""
    ap = argparse.ArgumentParser(prog="python -m labkit.grading.gradescope")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("autograde", help="grade a Gradescope submission").add_argument("--root", default=str(ROOT))
    a = ap.parse_args(argv)
    return autograde(a.root)


if __name__ == "__main__":
    sys.exit(main())
