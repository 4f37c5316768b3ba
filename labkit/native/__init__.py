"""The C and C++ toolchain that lab 03's C (``labkit.hostc``) and labs 04-05's CUDA (``labkit.kernels``) share.

``csource`` reads C and CUDA C source: comments out, brackets paired, parameter lists read and calls checked against
them. ``build`` finds the host's C and C++ compilers and compiles shared libraries into one cache folder.
``loopback_bind.c`` is built with it for MPI jobs on one machine (``labkit.cluster.launch``).
"""

from __future__ import annotations

from .build import BuildFailed, c_compiler, c_compiler_path, cache_dir, cxx_compiler, find_compiler, shared_library
from .csource import Param, UnbalancedBracket, check_args, line_of, matching_bracket, parse_param, split_params, strip_comments

__all__ = ["BuildFailed", "Param", "UnbalancedBracket", "c_compiler", "c_compiler_path", "cache_dir", "check_args",
           "cxx_compiler", "find_compiler", "line_of", "matching_bracket", "parse_param", "shared_library", "split_params",
           "strip_comments"]
