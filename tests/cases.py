"""Inputs shared by the GPU tests and the compute-sanitizer run (fresh random values every call), and
the float64 reference every test and bench/ checks the kernels against."""
import math

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


# Blocks of the float64 reference: rows of about this many elements, columns this many at a time.
REFERENCE_BLOCK_ELEMS = 2**24
REFERENCE_BLOCK_COLS = 2**26


def expected_loss(x, t, ignore_index=-100, reduction="mean", weight=None, z_loss=0.0, label_smoothing=0.0,
                  softcap=None):
    """cross_entropy with its options in float64, written out. Class-index targets: a counted row's
    loss is (1 - eps) times its class's weight (1 without weights) times (lse - x_t), plus eps / C
    times the sum over classes j of w_j (lse - x_j), plus z_loss * lse**2; an ignored row's is 0; the
    mean divides the sum by the counted rows' weights; targets outside [0, C) give NaN in their row.
    Probability targets p (floating, x's shape): a row's loss is the sum over j of
    w_j ((1 - eps) p_j + eps / C) (lse - x_j), plus z_loss * lse**2, and the mean divides by the rows.
    Inputs (N, C, d1, ..., dk): a row per sample position. softcap: every logit x read as
    softcap * tanh(x / softcap) first. Rows and columns go a block at a time, so that N*C > 2^31
    fits in memory."""
    probs = t.is_floating_point()
    if x.dim() != 2:  # (C,): one row; (N, C, d1, ..., dk): the classes last, a row per position
        positions = x.shape[:1] + x.shape[2:] if x.dim() > 1 else ()
        cols = x.shape[1] if x.dim() > 1 else x.shape[0]
        rows_x = x.movedim(1, -1).reshape(-1, cols) if x.dim() > 1 else x[None]
        rows_t = (t.movedim(1, -1).reshape(-1, cols) if x.dim() > 1 else t[None]) if probs else t.reshape(-1)
        out = expected_loss(rows_x, rows_t, ignore_index, reduction, weight, z_loss, label_smoothing, softcap)
        return out.reshape(positions) if reduction == "none" else out
    cols, eps = x.shape[1], label_smoothing

    def logit(v):  # in float64, capped where asked
        return softcap * torch.tanh(v.double() / softcap) if softcap else v.double()

    w_all = weight.double() if weight is not None else None
    col_blocks = range(0, cols, REFERENCE_BLOCK_COLS)
    losses, divisor = [x.new_zeros(0, dtype=torch.float64)], x.new_zeros((), dtype=torch.float64)
    row_block = max(1, REFERENCE_BLOCK_ELEMS // max(1, cols))
    for r0 in range(0, x.shape[0], row_block):
        xr, tr = x[r0:r0 + row_block], t[r0:r0 + row_block]
        blocks = [logit(xr[:, c0:c0 + REFERENCE_BLOCK_COLS]) for c0 in col_blocks]
        lse = torch.logsumexp(torch.stack([torch.logsumexp(b, 1) for b in blocks], 1), 1)
        if probs:
            loss = sum((((1 - eps) * tr[:, c0:c0 + b.shape[1]].double() + eps / cols)
                        * (1.0 if w_all is None else w_all[c0:c0 + b.shape[1]]) * (lse[:, None] - b)).sum(1)
                       for c0, b in zip(col_blocks, blocks))
            losses.append(loss + z_loss * lse**2)
            divisor += xr.shape[0]
            continue
        tr = tr.long()
        counted = tr != ignore_index
        bad = counted & ((tr < 0) | (tr >= cols))
        col = tr.clamp(0, cols - 1)
        w = w_all[col] if w_all is not None else torch.ones_like(lse)
        loss = w * (lse - logit(xr.gather(1, col[:, None])[:, 0]))
        if eps:  # no term at eps 0, even where lse - x is inf
            smooth = sum(((lse[:, None] - b) * (1.0 if w_all is None else w_all[c0:c0 + b.shape[1]])).sum(1)
                         for c0, b in zip(col_blocks, blocks))
            loss = (1 - eps) * loss + eps / cols * smooth
        losses.append(torch.where(counted, (loss + z_loss * lse**2).masked_fill(bad, math.nan), 0.0))
        divisor += torch.where(counted, w, 0.0).sum()
    loss = torch.cat(losses)
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / divisor
