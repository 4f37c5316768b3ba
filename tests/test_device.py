import numpy as np
import pytest

from labkit import device


def test_cpu_forced(monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert device.get_xp() is np
    assert device.get_xp("cpu") is np


def test_gpu_demanded_without_one_says_why(monkeypatch):
    ok, why = device.gpu_status()
    if ok:
        pytest.skip("a GPU is usable here")
    with pytest.raises(RuntimeError, match="no GPU can be used"):
        device.get_xp("gpu")
    monkeypatch.setenv("LABKIT_DEVICE", "auto")
    assert device.get_xp() is np  # auto falls back to NumPy


def test_unknown_device():
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        device.get_xp("tpu")


def test_array_module_and_to_numpy():
    a = np.arange(3)
    assert device.array_module(a, 1.0, [1]) is np
    assert device.to_numpy(a) is a
    assert isinstance(device.to_numpy([1, 2]), np.ndarray)
