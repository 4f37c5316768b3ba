"""The GPUs labkit models, each stated once: how a device's name names it, the architecture its kernels are compiled
for, the shared memory a block may opt in to, its memory, and its published rates with where each comes from.

    gpus.GPUS["H100 SXM"].arch        # "sm_90"
    gpus.named("Tesla T4").name       # "T4"

Everything that needs a GPU's figures reads this table: the speed-of-light model (:mod:`.speed_of_light`), the
architectures every kernel is compiled for (:data:`labkit.kernels.tools.ARCHS`) and the emulator's shared memory
(:mod:`.loader`). Adding a GPU is one entry here, and its row in tests/test_speed_of_light.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """A GPU's published figures and where each comes from."""

    name: str
    pattern: str              # a regular expression a CUDA device's name matches (case aside)
    arch: str                 # the architecture kernels are compiled for (NVRTC's and nvcc's -arch)
    shared_per_block: int     # bytes of shared memory one block may opt in to
    memory_bytes: int         # device memory
    dram_bytes_s: float
    l2_bytes: int
    sms: int
    clock_hz: float
    fp32_flops_s: float
    l2_bytes_s: float
    sources: str

    @property
    def shared_wavefronts_s(self) -> float:
        """Wavefronts per second, all SMs: one 128-byte wavefront per clock per SM."""
        return self.sms * self.clock_hz


_L2_RATIO = 5120 * 1.41e9 / 2.039e12  # A100: L2 read bandwidth (5,120 B/clk at 1.41 GHz) over its HBM2e bandwidth
GPUS = {g.name: g for g in (
    GPU("H100 SXM", r"H100", "sm_90", 227 << 10, 80 << 30, 3.35e12, 50 << 20, 132, 1.98e9, 66.9e12, 3.35e12 * _L2_RATIO,
        "NVIDIA H100 Tensor Core GPU datasheet (80 GB, 3.35 TB/s HBM3, 67 TFLOPS FP32); NVIDIA H100 Tensor Core GPU "
        "Architecture whitepaper (132 SMs, 1.98 GHz boost, 50 MB L2, 227 KB shared memory per block); L2 bandwidth not "
        "published: assumed the A100's L2/DRAM ratio"),
    GPU("A100 SXM", r"A100", "sm_80", 163 << 10, 80 << 30, 2.039e12, 40 << 20, 108, 1.41e9, 19.5e12, 5120 * 1.41e9,
        "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM: 2,039 GB/s HBM2e, 19.5 TFLOPS FP32); NVIDIA A100 Tensor Core "
        "GPU Architecture whitepaper (108 SMs, 1.41 GHz, 40 MB L2, L2 read 5,120 B/clk, 163 KB shared memory per "
        "block)"),
    GPU("T4", r"\bT4\b", "sm_75", 64 << 10, 16 << 30, 320e9, 4 << 20, 40, 1.59e9, 8.1e12, 320e9 * _L2_RATIO,
        "NVIDIA T4 Tensor Core GPU datasheet (16 GB, 320 GB/s GDDR6, 8.1 TFLOPS FP32); NVIDIA Turing GPU Architecture "
        "whitepaper (40 SMs, 1.59 GHz boost, 4 MB L2, 64 KB shared memory per block); L2 bandwidth not published: "
        "assumed the A100's L2/DRAM ratio"),
)}
DEFAULT = "H100 SXM"  # modelled where no GPU of the table is in use, and the GPU the emulator stands for


def named(device: str | None) -> GPU | None:
    """The table's GPU whose pattern a device name matches ("NVIDIA H100 80GB HBM3" is the H100 SXM), or None."""
    text = (device or "").upper()
    return next((g for g in GPUS.values() if re.search(g.pattern, text)), None)


__all__ = ["GPU", "GPUS", "DEFAULT", "named"]
