import os
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("LABKIT_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent.parent


def real_data_dir() -> Path | None:
    """The folder with the reference MNIST files, when the run has one (CI points LABKIT_DATA at it)."""
    env = os.environ.get("LABKIT_DATA")
    for cand in ([Path(env)] if env else []) + [ROOT / "data", ROOT.parent / "shared" / "data"]:
        if (cand / "mnist" / "train-labels-idx1-ubyte.gz").exists():
            return cand
    return None


@pytest.fixture(scope="session")
def data_dir():
    d = real_data_dir()
    if d is None:
        pytest.skip("no MNIST files here (set LABKIT_DATA to a folder holding mnist/ and fashion-mnist/)")
    return d


@pytest.fixture(scope="session")
def digits():
    """MNIST when available, else the embedded digit set: ((x_train, y_train), (x_test, y_test))."""
    from labkit.data import EmbeddedDataWarning, load_mnist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbeddedDataWarning)
        return load_mnist(root=real_data_dir())
