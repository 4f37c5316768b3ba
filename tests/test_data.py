import gzip
import http.server
import shutil
import threading
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from labkit import data
from labkit.data import DataError, SubsetDataWarning


def write_idx(path, arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x.gz", arr)
    np.testing.assert_array_equal(data.read_idx(tmp_path / "x.gz"), arr)


def test_read_idx_truncated_names_file(tmp_path):
    arr = np.zeros((5, 28, 28), dtype=np.uint8)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    header = bytes([0, 0, 0x08, 3]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    with gzip.open(p, "wb") as f:
        f.write(header + arr.tobytes()[:-100])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz.*truncated"):
        data.read_idx(p)


def test_read_idx_not_gzip_and_bad_magic(tmp_path):
    p = tmp_path / "a.gz"
    p.write_bytes(b"this is not gzip")
    with pytest.raises(DataError, match="a.gz is not a readable gzip"):
        data.read_idx(p)
    with gzip.open(p, "wb") as f:
        f.write(b"\x12\x34\x08\x01\x00\x00\x00\x01\x07")
    with pytest.raises(DataError, match="magic"):
        data.read_idx(p)


def fake_dataset(folder, n=6):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    write_idx(folder / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
    write_idx(folder / "train-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    write_idx(folder / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, n))
    return folder


def test_checksum_mismatch_names_file_and_fix(tmp_path):
    fake_dataset(tmp_path / "mnist")
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz is corrupt.*labkit data fetch"):
        data.load_mnist(root=tmp_path)
    (xtr, ytr), (xte, yte) = data.load_mnist(root=tmp_path, verify=False)  # structure alone is fine
    assert xtr.shape == (6, 784) and xtr.dtype == np.float32 and ytr.dtype == np.int64


def test_mismatched_images_and_labels(tmp_path):
    folder = fake_dataset(tmp_path / "mnist")
    write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(5))
    with pytest.raises(DataError, match="do not match"):
        data.load_mnist(root=tmp_path, verify=False)


def test_search_order_and_explicit_errors(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    fake_dataset(a / "mnist")
    fake_dataset(b / "mnist")
    monkeypatch.setenv("LABKIT_DATA", str(b))
    assert data.locate("mnist", a).path == a / "mnist"  # the argument wins
    assert data.locate("mnist").found_by == "LABKIT_DATA"
    assert data.locate("mnist", a / "mnist").path == a / "mnist"  # a folder holding the files directly
    with pytest.raises(DataError, match="holds no fashion-mnist"):
        data.locate("fashion-mnist")  # an explicit place that lacks the set is an error, not a fallback
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="LABKIT_DATA"):
        data.locate("mnist")
    with pytest.raises(ValueError, match="unknown dataset"):
        data.locate("cifar")


def test_partial_folder_lists_missing_files(tmp_path):
    folder = fake_dataset(tmp_path / "mnist")
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte.gz"):
        data.locate("mnist", tmp_path)


def test_without_mnist_the_shipped_subset_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path)
    assert data.locate().kind == "subset" and "10,000 training images" in data.locate().describe()
    with pytest.warns(SubsetDataWarning, match="labkit data fetch"):
        (xtr, ytr), (xte, yte) = data.load_mnist()
    assert xtr.shape == (10_000, 784) and xte.shape == (2_000, 784)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int64 and 0.0 <= xtr.min() and xtr.max() == 1.0
    assert np.bincount(ytr).tolist() == [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    assert np.bincount(yte).tolist() == [189, 222, 212, 242, 196, 186, 158, 215, 193, 187]
    with pytest.warns(SubsetDataWarning):
        tr, va, te = data.load_mnist(validation=1000)
    assert len(tr[0]) == 9000 and len(va[0]) == 1000
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # quiet: for a caller that says itself which data it used
        assert np.array_equal(data.load_mnist(quiet=True)[0][0], xtr)
    assert data.verify() == data.SUBSET_DIR
    assert all(p.stat().st_size < 2 << 20 for p in data.SUBSET_DIR.glob("*.gz")), "well under the 4 MB file guard"


def test_fashion_mnist_has_no_subset(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path)
    assert "not found" in data.locate("fashion-mnist").describe()
    with pytest.raises(DataError, match="labkit data fetch"):
        data.load_mnist(dataset="fashion-mnist")  # digits under Fashion-MNIST's name would be wrong data


def test_the_subset_is_the_original_files_images(data_dir, tmp_path):
    """Rebuilt from the originals, the subset holds the same pixels and labels as the shipped files."""
    rebuilt = data.write_subset(data_dir / "mnist", tmp_path)
    full = {k: data.read_idx(data_dir / "mnist" / n) for k, n in data.FILES.items()}
    for key, name in data.FILES.items():
        shipped = data.read_idx(data.SUBSET_DIR / name)
        np.testing.assert_array_equal(shipped, data.read_idx(rebuilt / name))
        part = slice(0, data.SUBSET_TRAIN) if key.startswith("train") else slice(None, None, data.SUBSET_TEST_STEP)
        np.testing.assert_array_equal(shipped, full[key][part])


def test_a_damaged_subset_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path)
    copy = tmp_path / "subset"
    copy.mkdir()
    for p in data.SUBSET_DIR.glob("*.gz"):
        copy.joinpath(p.name).write_bytes(p.read_bytes())
    victim = copy / "t10k-labels-idx1-ubyte.gz"
    victim.write_bytes(victim.read_bytes()[:-10])
    monkeypatch.setattr(data, "SUBSET_DIR", copy)
    with pytest.warns(SubsetDataWarning), pytest.raises(DataError, match="t10k-labels.*missing or damaged.*reinstall"):
        data.load_mnist()


def test_real_mnist(data_dir):
    (xtr, ytr), (xte, yte) = data.load_mnist(root=data_dir)
    assert xtr.shape == (60000, 784) and xte.shape == (10000, 784)
    assert xtr.dtype == np.float32 and 0 <= xtr.min() and xtr.max() == 1.0
    assert np.bincount(ytr).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(yte).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    tr, va, te = data.load_mnist(root=data_dir, validation=10000)
    assert (len(tr[0]), len(va[0]), len(te[0])) == (50000, 10000, 10000)
    np.testing.assert_array_equal(va[1], ytr[50000:])
    (x28, _), _ = data.load_mnist(root=data_dir, flatten=False)
    assert x28.shape == (60000, 28, 28)


def test_real_fashion_mnist(data_dir):
    (xtr, ytr), (xte, yte) = data.load_mnist(root=data_dir, dataset="fashion-mnist")
    assert np.bincount(ytr).tolist() == [6000] * 10 and np.bincount(yte).tolist() == [1000] * 10
    assert data.verify("fashion-mnist", data_dir) == data_dir / "fashion-mnist"


def test_one_hot():
    y = np.array([0, 3, 9])
    Y = data.one_hot(y)
    assert Y.shape == (3, 10) and Y.sum() == 3 and Y[1, 3] == 1
    with pytest.raises(ValueError, match="labels must lie"):
        data.one_hot(np.array([10]))


def test_batches_seeded_and_complete():
    x, y = np.arange(23)[:, None], np.arange(23)
    got = [yb for _, yb in data.batches(x, y, 5, seed=3)]
    again = [yb for _, yb in data.batches(x, y, 5, seed=3)]
    assert [len(b) for b in got] == [5, 5, 5, 5, 3]
    assert all((a == b).all() for a, b in zip(got, again))
    assert sorted(np.concatenate(got).tolist()) == list(range(23))
    assert not (np.concatenate(got) == np.arange(23)).all()
    assert [len(b) for _, b in data.batches(x, y, 5, seed=None, drop_last=True)] == [5] * 4
    for xb, yb in data.batches(x, y, 4, seed=1):
        assert (xb[:, 0] == yb).all()
    with pytest.raises(ValueError, match="x has 23 samples but y has 2"):
        next(data.batches(x, y[:2], 5))


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve(tmp_path):
    """Serve a folder over HTTP on 127.0.0.1 and yield (folder, url)."""
    root = tmp_path / "mirror"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(root)))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def test_fetch_from_mirror(serve, data_dir, tmp_path):
    root, url = serve
    for name in data.FILES.values():
        shutil.copy(data_dir / "mnist" / name, root / name)
    dest = tmp_path / "dest"
    folder = data.fetch("mnist", dest=dest, mirrors=["http://127.0.0.1:9/", url], progress=False)  # first one fails
    assert sorted(p.name for p in folder.iterdir()) == sorted(data.FILES.values())
    assert data.verify("mnist", dest) == folder


def test_fetch_bad_download_leaves_nothing(serve, tmp_path):
    root, url = serve
    for name in data.FILES.values():
        (root / name).write_bytes(b"not the file")
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match="(?s)could not download train-images-idx3-ubyte.gz.*checksum"):
        data.fetch("mnist", dest=dest, mirrors=[url], progress=False)
    assert list((dest / "mnist").iterdir()) == []  # no partial or corrupt file is left behind


def test_report_tries_fetch_once_and_moves_on_without_a_network(tmp_path, monkeypatch, capsys):
    from labkit import report

    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path)
    monkeypatch.setenv("LABKIT_MIRROR", "http://127.0.0.1:9/")  # nothing listens there: refused at once
    t0 = time.perf_counter()
    assert report.try_fetch_once(progress=False) is False
    assert time.perf_counter() - t0 < 10
    out = capsys.readouterr().out
    assert "trying `labkit data fetch` once" in out and "no download" in out and "MNIST subset shipped" in out
    assert not any(p.is_file() for p in tmp_path.rglob("*")), "a failed try leaves no file behind"
    assert data.locate().kind == "subset"


def test_report_fetches_mnist_when_it_can(serve, data_dir, tmp_path, monkeypatch, capsys):
    from labkit import report

    root, url = serve
    for name in data.FILES.values():
        shutil.copy(data_dir / "mnist" / name, root / name)
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path / "data")
    monkeypatch.setenv("LABKIT_MIRROR", url)
    assert report.try_fetch_once(progress=False) is True
    assert data.locate().kind == "files" and "fetched and verified" in capsys.readouterr().out
    assert report.try_fetch_once(progress=False) is False, "once MNIST is here, nothing is tried again"


def test_status_lines(tmp_path, monkeypatch):
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "REPO_DATA", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lines = data.status()
    assert len(lines) == 2 and "subset" in lines[0] and "not found" in lines[1]


def _swap_train_and_test(src: Path, dest: Path) -> Path:
    folder = dest / "mnist"
    folder.mkdir(parents=True)
    for name in data.FILES.values():
        shutil.copy(src / "mnist" / name, folder / name)
    a, b = folder / "train-images-idx3-ubyte.gz", folder / "t10k-images-idx3-ubyte.gz"
    tmp = folder / "x"
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    return folder


def test_swapped_files_are_named_and_never_deleted(data_dir, tmp_path):
    folder = _swap_train_and_test(data_dir, tmp_path)
    before = {p.name: data.sha256(p) for p in folder.iterdir()}
    with pytest.raises(DataError) as e:  # verify lists every bad file, each named for what it is
        data.verify("mnist", tmp_path)
    msg = str(e.value)
    assert "2 of the 4 mnist files" in msg and "a valid t10k-images-idx3-ubyte.gz of mnist" in msg
    assert "a valid train-images-idx3-ubyte.gz of mnist" in msg and "corrupt" not in msg and "nothing was deleted" in msg
    with pytest.raises(data.WrongFileError, match="swapped or misnamed"):  # no network needed to refuse
        data.fetch("mnist", dest=tmp_path, mirrors=["http://127.0.0.1:9/"], progress=False, timeout=2)
    assert {p.name: data.sha256(p) for p in folder.iterdir()} == before  # fetch deleted nothing


def test_a_failed_fetch_keeps_a_damaged_file_and_a_good_one_replaces_it(serve, data_dir, tmp_path):
    root, url = serve
    folder = tmp_path / "dest" / "mnist"
    folder.mkdir(parents=True)
    damaged = folder / "train-images-idx3-ubyte.gz"  # the first file fetch tries
    damaged.write_bytes(b"half a file")
    with pytest.raises(DataError, match="damaged .* was left as it was"):
        data.fetch("mnist", dest=tmp_path / "dest", mirrors=["http://127.0.0.1:9/"], progress=False, timeout=2)
    assert damaged.read_bytes() == b"half a file"
    for name in data.FILES.values():
        shutil.copy(data_dir / "mnist" / name, root / name)
    data.fetch("mnist", dest=tmp_path / "dest", mirrors=[url], progress=False)
    assert data.verify("mnist", tmp_path / "dest") == folder  # replaced only once the new file was verified


def _without_root_file_access():
    """In a child about to exec: drop the capabilities that let root read any file (CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH) from the bounding set, so the exec'd program meets file permissions as a user does."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unreadable_data_is_a_data_error_with_the_fix(tmp_path):
    """As a user without read access (root reads everything, so as root the child drops that power first)."""
    import os
    import subprocess
    import sys

    base = tmp_path
    try:
        folder = base / "data" / "mnist"
        folder.mkdir(parents=True)
        for name in data.FILES.values():
            (folder / name).write_bytes(b"x")
        folder.chmod(0o000)
        code = ("from labkit import data\n"
                "for call in (lambda: data.locate('mnist', r), lambda: data.verify('mnist', r),"
                " lambda: data.load_mnist(root=r)):\n"
                "    try:\n        call()\n    except data.DataError as e:\n        print('DataError:', e)\n")
        code = f"r = {str(base / 'data')!r}\n" + code
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             preexec_fn=_without_root_file_access if os.geteuid() == 0 else None)
        assert run.returncode == 0, run.stderr[-2000:]
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("DataError:")]
        assert len(lines) == 3 and all("cannot be read" in ln and "chmod" in ln for ln in lines), run.stdout
    finally:
        folder.chmod(0o755)
