"""MNIST and Fashion-MNIST: find, verify, read (IDX format), fetch, and shuffle into mini-batches.

Search order for the four original ``.gz`` files of a data set:
explicit ``root`` argument, then ``$LABKIT_DATA``, then the repository's ``data/`` folder.
A root may hold ``mnist/`` and ``fashion-mnist/`` sub-folders or the four files directly.
When MNIST is found nowhere, the subset of it shipped inside labkit (``labkit/mnist_subset/``: the first
10,000 training images and every fifth test image of the original files, gzip IDX, checksummed) is used
instead, with a warning saying how to get the rest. Fashion-MNIST has no such subset.

Files are parsed as raw IDX bytes; nothing is ever unpickled.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import settings
from .device import array_module
from .errors import LabkitError
from .progress import progress_bar

DATASETS = ("mnist", "fashion-mnist")
FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
# sha256 of the original distribution files.
SHA256 = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "train-labels-idx1-ubyte.gz": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "t10k-images-idx3-ubyte.gz": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        "t10k-labels-idx1-ubyte.gz": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
    },
}
MIRRORS = {
    "mnist": [
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
    ],
    "fashion-mnist": [
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    ],
}
_CHECKOUT = Path(__file__).resolve().parent.parent
# In a checkout (an editable install) data sets go to the repository's data/; an installed package has no
# such folder (it would be site-packages/data), so it uses the user's cache folder, as pooch and torchvision do.
REPO_DATA = _CHECKOUT / "data" if (_CHECKOUT / "pyproject.toml").is_file() else None


def default_dir() -> Path:
    """Where ``fetch`` puts data sets and ``locate`` looks last: the checkout's data/, else ~/.cache/labkit/data."""
    return REPO_DATA if REPO_DATA is not None else settings.cache_dir() / "data"
CLASS_NAMES = {
    "mnist": [str(i) for i in range(10)],
    "fashion-mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                      "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
}

GET_MNIST_HINT = (
    "To train on MNIST, put the four original files in data/mnist/ (or data/fashion-mnist/), "
    "set LABKIT_DATA to a folder holding mnist/ and fashion-mnist/, "
    "or run `labkit data fetch` where there is a network."
)


class DataError(LabkitError, ValueError):
    """A data file is missing, truncated, corrupt or of the wrong kind; the message names the fix."""


class WrongFileError(DataError):
    """A valid original file under another file's name (train and test swapped, or the other data set's)."""


class SubsetDataWarning(UserWarning):
    """No full MNIST was found and the subset shipped with labkit is used instead."""


# The MNIST subset shipped inside the package: the original files' first SUBSET_TRAIN training images and every
# SUBSET_TEST_STEP-th test image (both halves of the test set's writers), written by :func:`write_subset`.
SUBSET_DIR = Path(__file__).resolve().parent / "mnist_subset"
SUBSET_TRAIN = 10_000
SUBSET_TEST_STEP = 5
SUBSET_SHA256 = {
    "train-images-idx3-ubyte.gz": "11a772a6dc925b05dd399880865d80fdc378f1482a27072a7fe2c10be2367eda",
    "train-labels-idx1-ubyte.gz": "4e8b4ac90e302aa725dd50c14268e8630d3941e30cf889ea15dfa1a6dedf8665",
    "t10k-images-idx3-ubyte.gz": "21975b872a7f02dcad2075e764a44f64c147020929d92cd0fb8da555a730017a",
    "t10k-labels-idx1-ubyte.gz": "6fb827417518d943611b31c7b601f2180323466786e2fc4cc87d2705a9af3fa7",
}
SUBSET_DESCRIPTION = (f"the MNIST subset shipped with labkit ({SUBSET_TRAIN:,} training images, "
                      f"{10_000 // SUBSET_TEST_STEP:,} test images of the original files)")


@dataclass(frozen=True)
class Source:
    """Where a data set comes from: ``kind`` is ``"files"``, ``"subset"`` (MNIST's shipped subset) or ``"absent"``."""

    dataset: str
    kind: str
    path: Path | None
    found_by: str  # "argument", "LABKIT_DATA", "data/", "cache", "subset" or "absent"

    def describe(self) -> str:
        """One line for people: which data and where from."""
        if self.kind == "subset":
            return f"{self.dataset}: {SUBSET_DESCRIPTION}; full MNIST not found (labkit data fetch)"
        if self.kind == "absent":
            return f"{self.dataset}: not found (labkit data fetch --dataset {self.dataset})"
        return f"{self.dataset}: {self.path} (found by {self.found_by})"


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")


def _unreadable(path: Path, e: OSError) -> DataError:
    """A permission problem as a DataError with the path and the fix."""
    folder = path.parent if path.suffix else path  # no stat here: it would be refused too
    return DataError(f"{path} cannot be read ({e.strerror or e}): give yourself read access (chmod -R u+rX "
                     f"{folder}), or copy the files to a folder of yours and point LABKIT_DATA at it")


def _files_in(folder: Path, dataset: str) -> Path | None:
    """The folder holding the dataset's files under ``folder`` (itself or its sub-folder), if any file is there."""
    for cand in (folder / dataset, folder):
        try:
            if any((cand / name).exists() for name in FILES.values()):
                return cand
        except PermissionError as e:
            raise _unreadable(cand, e) from None
    return None


def original_with(digest: str) -> tuple[str, str] | None:
    """(data set, file name) of the original file with this sha256, or None: a file in the wrong place (train and
    test swapped, MNIST in the Fashion-MNIST folder) is named for what it is instead of being called corrupt."""
    return next(((ds, name) for ds, sums in SHA256.items() for name, d in sums.items() if d == digest), None)


def locate(dataset: str = "mnist", root: str | os.PathLike | None = None) -> Source:
    """Find a data set by the search order; raise :class:`DataError` when an explicit place lacks it."""
    _check_dataset(dataset)
    candidates: list[tuple[Path, str, bool]] = []
    if root is not None:
        candidates.append((Path(root).expanduser(), "argument", True))
    env = settings.data_dir()
    if env is not None:
        candidates.append((env, "LABKIT_DATA", True))
    candidates.append((default_dir(), "data/" if REPO_DATA is not None else "cache", False))
    for folder, how, explicit in candidates:
        try:
            found = _files_in(folder, dataset) if folder.is_dir() else None
        except PermissionError as e:
            raise _unreadable(folder, e) from None
        if found is not None:
            missing = [n for n in FILES.values() if not (found / n).exists()]
            if missing:
                raise DataError(
                    f"{found} holds only part of {dataset}: missing {', '.join(missing)}. "
                    f"Copy all four original files there, or run `labkit data fetch --dataset {dataset}`."
                )
            return Source(dataset, "files", found, how)
        if explicit:
            what = "the folder given" if how == "argument" else f"LABKIT_DATA={env}"
            raise DataError(
                f"{what} ({folder}) holds no {dataset} files: expected {folder / dataset}/ or {folder}/ "
                f"with {', '.join(FILES.values())}. " + GET_MNIST_HINT
            )
    if dataset == "mnist":
        return Source(dataset, "subset", SUBSET_DIR, "subset")
    return Source(dataset, "absent", None, "absent")


def sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_verified: dict[tuple[str, int, int], bool] = {}


def verify_file(path: Path, dataset: str, cached: bool = True) -> None:
    """Check one original file's sha256, once per process unless ``cached=False``.

    Raises :class:`DataError` naming the file and the fix.
    """
    expected = SHA256[dataset].get(path.name)
    if expected is None:
        raise DataError(f"{path.name} is not one of the {dataset} files ({', '.join(FILES.values())})")
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if cached and key in _verified:
            return
        got = sha256(path)
    except PermissionError as e:
        raise _unreadable(path, e) from None
    if got != expected:
        other = original_with(got)
        if other is not None:
            raise WrongFileError(
                f"{path} is not {path.name} but a valid {other[1]} of {other[0]}: the files are swapped or misnamed. "
                f"Rename it to {other[1]}" + (f" (in a {other[0]}/ folder)" if other[0] != dataset else "")
                + ", and put the real " + path.name + " here; nothing was deleted.")
        raise DataError(
            f"{path} is corrupt, truncated or not the original {dataset} file "
            f"(sha256 {got[:16]}..., expected {expected[:16]}...). "
            f"Delete it and copy the original again, or run `labkit data fetch --dataset {dataset}`."
        )
    _verified[key] = True


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read a gzip-compressed IDX file (unsigned bytes) into a uint8 array of its stated shape."""
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except PermissionError as e:
        raise _unreadable(path, e) from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path} is not a readable gzip file ({e}); delete it and copy or fetch it again") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path} is not an IDX file (bad magic number)")
    if raw[2] != 0x08:
        raise DataError(f"{path}: IDX type code {raw[2]:#x} is not unsigned byte (0x08)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated inside its header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != count:
        raise DataError(
            f"{path} is truncated or padded: header says {shape} = {count} bytes, "
            f"file holds {len(raw) - header}; delete it and copy or fetch it again"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _load_files(folder: Path, dataset: str, verify: bool):
    arrays = {}
    for key, name in FILES.items():
        path = folder / name
        if verify:
            verify_file(path, dataset)
        arrays[key] = read_idx(path)
    for split in ("train", "test"):
        xi, yi = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if xi.ndim != 3 or yi.ndim != 1 or xi.shape[0] != yi.shape[0]:
            raise DataError(
                f"{folder}: {split} images {xi.shape} and labels {yi.shape} do not match; "
                "the files are mixed up or from different data sets"
            )
    return arrays


def _write_idx_gz(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte IDX file, gzip-compressed with no name or time in its header (the same bytes every time)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes(), 9, mtime=0))


def write_subset(source: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the shipped subset from the four original MNIST files in ``source`` into ``out`` (how
    ``labkit/mnist_subset/`` was made): the first ``SUBSET_TRAIN`` training images and every
    ``SUBSET_TEST_STEP``-th test image, with their labels, in the original gzip IDX format."""
    source, out = Path(source), Path(out)
    a = _load_files(source, "mnist", verify=True)
    out.mkdir(parents=True, exist_ok=True)
    parts = {"train": slice(0, SUBSET_TRAIN), "test": slice(None, None, SUBSET_TEST_STEP)}
    for key, name in FILES.items():
        _write_idx_gz(out / name, a[key][parts[key.split("_")[0]]])
    return out


def _load_subset(verify: bool):
    if verify:
        for name, expected in SUBSET_SHA256.items():
            path = SUBSET_DIR / name
            try:
                got = sha256(path)
            except FileNotFoundError:
                got = None
            if got != expected:
                raise DataError(f"{path}, part of the MNIST subset shipped with labkit, is missing or damaged: "
                                "reinstall labkit (or git checkout labkit/mnist_subset), or " + GET_MNIST_HINT)
    return _load_files(SUBSET_DIR, "mnist", verify=False)


def load_mnist(
    root: str | os.PathLike | None = None,
    dataset: str = "mnist",
    validation: int = 0,
    verify: bool = True,
    flatten: bool = True,
    quiet: bool = False,
):
    """Load a data set as ``((x_train, y_train), (x_test, y_test))``; x float32 in [0, 1], y int64.

    ``validation=n`` holds the last ``n`` training images out and returns three pairs
    ``(train, validation, test)``, as network.py did with 50k/10k/10k.
    ``flatten=False`` keeps images as (n, 28, 28).
    ``quiet=True`` loads the shipped subset without a :class:`SubsetDataWarning`, for a caller that says itself which
    data set it used (a benchmark's JSON, an MPI job whose notebook already said it).
    """
    src = locate(dataset, root)
    if src.kind == "absent":
        raise DataError(f"No {dataset} files found (labkit ships a subset of MNIST only). " + GET_MNIST_HINT)
    if src.kind == "subset":
        if not quiet:
            warnings.warn(f"No full MNIST found; using {SUBSET_DESCRIPTION}. " + GET_MNIST_HINT,
                          SubsetDataWarning, stacklevel=2)
        a = _load_subset(verify)
    else:
        a = _load_files(src.path, dataset, verify)
    x_tr = a["train_images"].astype(np.float32)
    x_tr /= 255.0  # in place: one float copy of the images in memory, not two at once
    x_te = a["test_images"].astype(np.float32)
    x_te /= 255.0
    y_tr = a["train_labels"].astype(np.int64)
    y_te = a["test_labels"].astype(np.int64)
    if flatten:
        x_tr = x_tr.reshape(len(x_tr), -1)
        x_te = x_te.reshape(len(x_te), -1)
    if not validation:
        return (x_tr, y_tr), (x_te, y_te)
    if not 0 < validation < len(y_tr):
        raise ValueError(f"validation={validation} must be between 1 and {len(y_tr) - 1} (training set has {len(y_tr)})")
    cut = len(y_tr) - validation
    return (x_tr[:cut], y_tr[:cut]), (x_tr[cut:], y_tr[cut:]), (x_te, y_te)


def one_hot(y, n_classes: int = 10, dtype=np.float32):
    """Integer labels (n,) -> one-hot rows (n, n_classes), on the array module of ``y``."""
    xp = array_module(y)
    y = xp.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"one_hot expects labels of shape (n,), got {y.shape}")
    if y.size and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}); got min {int(y.min())}, max {int(y.max())}")
    out = xp.zeros((y.shape[0], n_classes), dtype=dtype)
    out[xp.arange(y.shape[0]), y] = 1
    return out


def batches(
    x, y, batch_size: int, seed: int | np.random.Generator | None = 0, drop_last: bool = False
) -> Iterator[tuple]:
    """Yield shuffled mini-batches ``(x_b, y_b)``; ``seed=None`` keeps the order."""
    n = len(x)
    if len(y) != n:
        raise ValueError(f"x has {n} samples but y has {len(y)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if seed is None:
        order = None
    else:
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        order = rng.permutation(n)
    stop = n - n % batch_size if drop_last else n
    for i in range(0, stop, batch_size):
        if order is None:
            yield x[i:i + batch_size], y[i:i + batch_size]
        else:
            idx = order[i:i + batch_size]
            yield x[idx], y[idx]


# -- status, verify, fetch (the `labkit data` command) ----------------------------------------


def status(root: str | os.PathLike | None = None) -> list[str]:
    """One line per data set saying where it would be loaded from."""
    lines = []
    for ds in DATASETS:
        try:
            lines.append(locate(ds, root).describe())
        except DataError as e:
            lines.append(f"{ds}: error: {e}")
    return lines


def verify(dataset: str = "mnist", root: str | os.PathLike | None = None) -> Path:
    """Verify all four files of a data set (checksums and IDX structure); return their folder."""
    src = locate(dataset, root)
    if src.kind == "subset":
        _load_subset(verify=True)
        return SUBSET_DIR
    if src.kind != "files":
        raise DataError(f"no {dataset} files to verify. " + GET_MNIST_HINT)
    problems = []
    for name in FILES.values():
        try:
            verify_file(src.path / name, dataset, cached=False)
        except DataError as e:
            problems.append(str(e))
    if problems:
        raise DataError(f"{len(problems)} of the {len(FILES)} {dataset} files in {src.path} are not right:\n  - "
                        + "\n  - ".join(problems))
    _load_files(src.path, dataset, verify=False)  # and their structure: headers, sizes, matching counts
    return src.path


def fetch(
    dataset: str = "mnist",
    dest: str | os.PathLike | None = None,
    mirrors: list[str] | None = None,
    progress: bool | None = None,
    timeout: float = 30.0,
) -> Path:
    """Download the four files into ``dest/<dataset>/`` (default: :func:`default_dir`).

    Each file is written to a temporary name, checked against its sha256, then renamed,
    so an interrupted download never leaves a file that looks complete.
    """
    _check_dataset(dataset)
    folder = Path(dest).expanduser() if dest is not None else default_dir()
    folder = folder / dataset
    folder.mkdir(parents=True, exist_ok=True)
    mirrors = mirrors or ([settings.mirror()] if settings.mirror() is not None else MIRRORS[dataset])
    for name in FILES.values():
        target = folder / name
        if target.exists():
            try:
                verify_file(target, dataset)
                continue
            except WrongFileError:
                raise  # a valid file in the wrong place: say so, touch nothing
            except DataError:
                pass  # corrupt: replaced below, but only by a download that is complete and verified
        errors = []
        for base in mirrors:
            url = base.rstrip("/") + "/" + name
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".part")
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r, os.fdopen(fd, "wb") as out:
                    total = int(r.headers.get("Content-Length") or 0) or None
                    with progress_bar(total=total, desc=name, unit="B", unit_scale=True, enable=progress) as bar:
                        for chunk in iter(lambda: r.read(1 << 16), b""):
                            out.write(chunk)
                            bar.update(len(chunk))
                got = sha256(tmp)
                if got != SHA256[dataset][name]:
                    raise DataError(f"checksum mismatch for {url} (sha256 {got[:16]}...)")
                os.replace(tmp, target)
                break
            except Exception as e:  # try the next mirror, report all failures at the end
                errors.append(f"{url}: {e}")
                Path(tmp).unlink(missing_ok=True)
        else:
            kept = f" The damaged {target} was left as it was." if target.exists() else ""
            raise DataError(
                f"could not download {name} from any mirror:\n  " + "\n  ".join(errors)
                + f"\nWithout a network, copy the four original files into {folder} by hand.{kept}"
            )
    return folder

