"""Launch plans for the CPU tests: the policy as the dispatch runs it, on GPUs' property tables."""
from crossent import dispatch, policy
from crossent.gpu import gpu_from

# The driver's figures (crossent.gpu.DEVICE_ATTRIBUTES) for every GPU a leaderboard offers, from the
# vendors' datasheets and the CUDA programming guide's limits per compute capability. The memory
# clock and bus width give the datasheet's bandwidth (twice the clock times the width).
_COLUMNS = ("major", "minor", "sms", "l2_bytes", "threads_per_sm", "smem_per_sm", "smem_reserved", "memory_khz",
            "bus_bits")
GPUS = {name: dict(zip(_COLUMNS, row)) for name, row in {
    #            cc      SMs  L2          threads  shared     reserve  memory kHz  bus bits  bandwidth
    "T4":        (7, 5,  40,  4 << 20,    1024,    64 << 10,  0,       5001000,    256),     # 320 GB/s
    "A10G":      (8, 6,  80,  6 << 20,    1536,    100 << 10, 1024,    6251000,    384),     # 600 GB/s
    "L4":        (8, 9,  58,  48 << 20,   1536,    100 << 10, 1024,    6251000,    192),     # 300 GB/s
    "L40S":      (8, 9,  142, 96 << 20,   1536,    100 << 10, 1024,    9001000,    384),     # 864 GB/s
    "A100-40GB": (8, 0,  108, 40 << 20,   2048,    164 << 10, 1024,    1215000,    5120),    # 1.56 TB/s
    "A100-80GB": (8, 0,  108, 40 << 20,   2048,    164 << 10, 1024,    1593000,    5120),    # 2.04 TB/s (SXM)
    "H100":      (9, 0,  132, 50 << 20,   2048,    228 << 10, 1024,    2619000,    5120),    # 3.35 TB/s
    "H200":      (9, 0,  132, 60 << 20,   2048,    228 << 10, 1024,    3201000,    6016),    # 4.8 TB/s
    "B200":      (10, 0, 148, 126 << 20,  2048,    228 << 10, 1024,    3906000,    8192),    # 8 TB/s
    "RTX 5090":  (12, 0, 170, 96 << 20,   1536,    100 << 10, 1024,    14001000,   512),     # 1.79 TB/s
}.items()}
GPU_PLANS = {name: gpu_from(table) for name, table in GPUS.items()}  # what the policy reads off each
H100, H200 = GPU_PLANS["H100"], GPU_PLANS["H200"]

# Shapes for the policy's invariants: every family, empty and lone rows, widths off every vector
# grid, split rows, more than 2^31 elements.
SHAPES = [(0, 7), (1, 1), (1, 4096), (3, 5), (4096, 129), (32768, 4096), (4096, 32000), (8192, 50257),
          (8192, 128256), (16, 256000), (1000000, 10), (65536, 1000), (2, 3 * 2**30), (131, 777777), (1, 2**24)]


def gpu(sms=132, l2_bytes=50 << 20, fast_memory=False):
    """The H100 with other SMs, L2 or memory: fast memory at twice the rate per SM that makes it fast,
    slow at half of it."""
    return H100._replace(sms=sms, l2_bytes=l2_bytes,
                         bandwidth=(2 if fast_memory else 0.5) * policy._FAST_MEMORY_PER_SM * sms)


def plan(rows, cols, elem_bytes, evict_first=None, stride=None, offset=0, on=H100):
    """The plan the dispatch takes for contiguous (rows, cols) logits (or rows `stride` apart, the
    first `offset` bytes off the 16-byte grid) on `on`; evict_first forces the kind of load."""
    stride = cols if stride is None else stride
    if evict_first is None:
        return policy.plan_launch(rows, cols, stride, elem_bytes, on, offset)
    family = policy._family(rows, cols, stride, elem_bytes, on, offset)
    return policy._shape(family, rows, cols, stride, elem_bytes, on, offset, evict_first)


def plan_on(monkeypatch, name, rows, cols, elem_bytes, offset=0):
    """dispatch.plan_on on the GPU `name` of GPUS, as the dispatch calls it."""
    monkeypatch.setattr(dispatch, "device_gpu", lambda _: GPU_PLANS[name])
    return dispatch.plan_on(0, rows, cols, cols, elem_bytes, offset)
