"""Inputs shared by the GPU tests and the compute-sanitizer run: fresh random values every call."""
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# (rows, cols): the headline shape, widths that are not a multiple of any vector width, rows split
# across CTAs (16 x 256000), one row (1 x 32003: a CTA of 1024 threads in fp32), one class, and
# short rows read in shared-memory tiles, a thread per row at 10 columns (1000000 x 10: tiles of
# 512 rows, two sweeps of a CTA's threads, and CTAs take several).
SHAPES = [(32768, 4096), (4001, 4096), (4096, 129), (1000, 10), (1000000, 10), (257, 4099), (16, 256000),
          (3, 100003), (1, 4096), (1, 32003), (1, 1), (5, 1), (2, 3), (0, 17)]

# A shape for each kernel the policy can choose: tiles of short rows (vector sweeps; rows of fewer
# than 4 vectors by a group of lanes each, or by a thread each, two elements a load where the width
# is even, else one), rows in registers, row batches, one row (test_policy checks that each takes
# its kernel, in every dtype).
PATHS = {"tiled": (512, 77), "tiled short": (3000, 10), "tiled short, thread per row": (200000, 12),
         "tiled short, thread per row, odd width": (200000, 11), "registers": (64, 5000), "row batches": (4000, 4096),
         "one row": (1, 4096)}


def logits(rows, cols, dtype, device="cuda", scale=4.0):
    return (torch.randn(rows, cols, device=device) * scale).to(dtype)


def targets(rows, cols, dtype=torch.int64, device="cuda"):
    return torch.randint(0, cols, (rows,), device=device, dtype=dtype)


def views(rows, cols, dtype, device="cuda"):
    """(name, tensor) pairs: logits that are not plain contiguous (rows, cols) tensors."""
    base = logits(rows + 1, cols + 3, dtype, device)
    flat = logits(1, rows * cols + 1, dtype, device)[0]
    return [
        ("unaligned start", base[:rows, 1:cols + 1]),   # first element off the 16-byte grid, stride C+3
        ("unaligned dense", flat[1:].view(rows, cols)),  # rows back to back, off the 16-byte grid
        ("padded rows", base[:rows, :cols]),            # aligned start, row stride C+3
        ("offset rows", base[1:, :cols]),
        ("transposed", logits(cols, rows, dtype, device).t()),  # columns not adjacent
    ]


def reference(x, t, ignore_index=-100):
    """float64 mean cross-entropy, a block at a time (so N*C > 2^31 fits in memory)."""
    total, count = torch.zeros((), dtype=torch.float64, device=x.device), 0
    row_block = max(1, 2**24 // max(1, x.shape[1]))
    for r0 in range(0, x.shape[0], row_block):
        xr, tr = x[r0:r0 + row_block], t[r0:r0 + row_block].long()
        keep = tr != ignore_index
        xr, tr = xr[keep], tr[keep]
        # log-sum-exp over column blocks, merged in float64
        lse = torch.stack([torch.logsumexp(xr[:, c0:c0 + 2**26].double(), dim=1)
                           for c0 in range(0, max(1, xr.shape[1]), 2**26)], dim=1)
        lse = torch.logsumexp(lse, dim=1)
        total += (lse - xr.gather(1, tr.unsqueeze(1)).squeeze(1).double()).sum()
        count += int(keep.sum())
    return total / count
