"""The fp32 peak of a CUDA device: SMs x fp32 lanes per SM x 2 (an FMA) x clock.

Plain Python over three numbers the driver reports (SM count, compute capability, clock), so
the benchmarks can state achieved TFLOP/s as a share of what the card can do in fp32 alone.
"""
from __future__ import annotations

from dataclasses import dataclass

# compute capability -> fp32 lanes per SM (the CUDA programming guide's arithmetic throughput table)
FP32_LANES = {
    (2, 0): 32, (2, 1): 48,
    (3, 0): 192, (3, 2): 192, (3, 5): 192, (3, 7): 192,
    (5, 0): 128, (5, 2): 128, (5, 3): 128,
    (6, 0): 64, (6, 1): 128, (6, 2): 128,
    (7, 0): 64, (7, 2): 64, (7, 5): 64,
    (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
    (9, 0): 128,
    (10, 0): 128, (10, 3): 128, (12, 0): 128, (12, 1): 128,
}


@dataclass(frozen=True)
class Fp32Peak:
    name: str
    sms: int
    capability: tuple[int, int]
    lanes_per_sm: int
    clock_hz: float

    @property
    def flops(self) -> float:
        return self.sms * self.lanes_per_sm * 2 * self.clock_hz

    def describe(self) -> str:
        major, minor = self.capability
        return (f"{self.name}: {self.sms} SMs x {self.lanes_per_sm} fp32 lanes (compute {major}.{minor}) x 2 "
                f"x {self.clock_hz / 1e9:.2f} GHz = {self.flops / 1e12:.1f} TFLOP/s fp32 peak")


def fp32_peak(name: str, sms: int, capability: tuple[int, int], clock_khz: int) -> Fp32Peak:
    """From the driver's MULTIPROCESSOR_COUNT, compute capability and CLOCK_RATE (kHz)."""
    if capability not in FP32_LANES:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(FP32_LANES))
        raise ValueError(f"no fp32 lane count for compute capability {capability[0]}.{capability[1]}; "
                         f"known: {known}")
    return Fp32Peak(name, sms, capability, FP32_LANES[capability], clock_khz * 1e3)


def device_peak(device) -> Fp32Peak:
    """The peak of a pycuda Device."""
    import pycuda.driver as cuda
    attr = cuda.device_attribute
    return fp32_peak(device.name(), device.get_attribute(attr.MULTIPROCESSOR_COUNT),
                     device.compute_capability(), device.get_attribute(attr.CLOCK_RATE))
