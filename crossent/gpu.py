"""A GPU as the launch policy sees it: the driver's figures (SMs, L2, threads and shared memory per
SM, memory bandwidth), read through the extension (build.device_gpu), nothing measured on one chip."""
from typing import NamedTuple


class Gpu(NamedTuple):
    """What the policy reads off a GPU."""
    cc: int              # compute capability, 10 * major + minor: the code built for it (sm_75's is its own)
    sms: int
    l2_bytes: int
    threads_per_sm: int  # resident threads per SM at most
    smem_per_sm: int     # shared memory per SM, bytes ...
    smem_reserved: int   # ... of which the system takes this much per CTA
    bandwidth: float     # peak DRAM bytes/s: the memory clock (double data rate) times the bus width


# What the extension asks the driver, in this order: torch reports only some of these, and fewer in
# older releases. (name, the CUDA runtime's attribute)
DEVICE_ATTRIBUTES = (
    ("major", "cudaDevAttrComputeCapabilityMajor"),
    ("minor", "cudaDevAttrComputeCapabilityMinor"),
    ("sms", "cudaDevAttrMultiProcessorCount"),
    ("l2_bytes", "cudaDevAttrL2CacheSize"),
    ("threads_per_sm", "cudaDevAttrMaxThreadsPerMultiProcessor"),
    ("smem_per_sm", "cudaDevAttrMaxSharedMemoryPerMultiprocessor"),
    ("smem_reserved", "cudaDevAttrReservedSharedMemoryPerBlock"),
    ("memory_khz", "cudaDevAttrMemoryClockRate"),
    ("bus_bits", "cudaDevAttrGlobalMemoryBusWidth"),
)


def gpu_from(attributes):
    """The policy's Gpu from the driver's attributes (a dict by DEVICE_ATTRIBUTES' names)."""
    a = attributes
    return Gpu(10 * a["major"] + a["minor"], a["sms"], a["l2_bytes"], a["threads_per_sm"], a["smem_per_sm"],
               a["smem_reserved"], 2e3 * a["memory_khz"] * a["bus_bits"] / 8)
