"""CUDA C kernels for the labs, runnable on a GPU (CuPy) and on any CPU (labkit's emulator).

    from labkit import kernels
    kernels.backend()                        # "cupy" or "emulator"
    c = kernels.matmul(a, b, variant="tiled")
    mod = kernels.load(my_source)            # a student's own .cu, checked on the emulator

Each ``*.cu`` file sits beside the Python module that launches its kernels (``softmax_rows.cu``, lab 05's reference
for an exercise, is loaded by name with :func:`load`); ``reference`` holds a NumPy function of the same signature for
every launcher. ``LABKIT_DEVICE=cpu`` forces the emulator.
"""

from __future__ import annotations

from ._launch import synchronize, time_kernel
from .conv import conv2d_relu_backward, conv2d_relu_forward
from .layers import act_backward, bias_act_forward, col_sum, outer, wt_delta
from .loader import (
    EmulatorUnavailable,
    Kernel,
    KernelCompileError,
    KernelError,
    Module,
    UnsupportedFeature,
    backend,
    kernel_source,
    load,
    load_file,
)
from .matmul import library_gflops, matmul
from .optim import sgd_momentum
from .reduce import accuracy_count, sse_reduce, sum_reduce
from .softmax import softmax_xent_backward, softmax_xent_forward
from .source import define

LAUNCHERS = ("matmul", "wt_delta", "outer", "bias_act_forward", "act_backward", "col_sum", "sgd_momentum",
             "softmax_xent_forward", "softmax_xent_backward", "sum_reduce", "sse_reduce", "accuracy_count",
             "conv2d_relu_forward", "conv2d_relu_backward")

__all__ = ["define", "EmulatorUnavailable", "Kernel", "KernelCompileError", "KernelError", "Module", "UnsupportedFeature",
           "backend",
           "kernel_source", "load", "load_file", "LAUNCHERS", "synchronize", "time_kernel",
           "library_gflops", "matmul", "wt_delta", "outer", "bias_act_forward", "act_backward", "col_sum", "sgd_momentum",
           "softmax_xent_forward", "softmax_xent_backward", "sum_reduce", "sse_reduce", "accuracy_count",
           "conv2d_relu_forward", "conv2d_relu_backward"]
