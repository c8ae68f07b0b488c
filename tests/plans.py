"""Launch plans for the CPU tests: the policy as the dispatch runs it, on GPUs' property tables."""
import types

import model_new
from model_new import _Gpu

# As torch reports them: SMs, L2 bytes, memory clock in kHz, bus width in bits.
H100_PROPS = dict(multi_processor_count=132, L2_cache_size=50 << 20, memory_clock_rate=2619000, memory_bus_width=5120)
H200_PROPS = dict(multi_processor_count=132, L2_cache_size=60 << 20, memory_clock_rate=3201000, memory_bus_width=6016)
A100_PROPS = dict(multi_processor_count=108, L2_cache_size=40 << 20, memory_clock_rate=1593000, memory_bus_width=5120)

H100 = _Gpu(132, 50 << 20, False)
H200 = _Gpu(132, 60 << 20, True)

# Shapes for the policy's invariants: every family, empty and lone rows, widths off every vector
# grid, split rows, more than 2^31 elements.
SHAPES = [(0, 7), (1, 1), (1, 4096), (3, 5), (4096, 129), (32768, 4096), (4096, 32000), (8192, 50257),
          (8192, 128256), (16, 256000), (1000000, 10), (65536, 1000), (2, 3 * 2**30), (131, 777777), (1, 2**24)]


def gpu(sms=132, l2_bytes=50 << 20, fast_memory=False):
    return _Gpu(sms, l2_bytes, fast_memory)


def props(**table):
    return types.SimpleNamespace(**table)


def plan(rows, cols, elem_bytes, evict_first=None, stride=None, offset=0, on=H100):
    """The plan the dispatch takes for contiguous (rows, cols) logits (or rows `stride` apart, the
    first `offset` bytes off the 16-byte grid) on `on`; evict_first forces the kind of load."""
    stride = cols if stride is None else stride
    if evict_first is None:
        return model_new._plan(rows, cols, stride, elem_bytes, on, offset)
    family = model_new._family(rows, cols, stride, elem_bytes, on, offset)
    return model_new._shape(family, rows, cols, stride, elem_bytes, on, offset, evict_first)


def plan_on(monkeypatch, table, rows, cols, elem_bytes, offset=0):
    """_plan_on for a GPU with these properties (torch's names), as the dispatch calls it."""
    monkeypatch.setattr(model_new, "_device_properties", lambda _: props(**table))
    model_new._plan_on.cache_clear()
    p = model_new._plan_on(0, rows, cols, cols, elem_bytes, offset)
    model_new._plan_on.cache_clear()
    return p
