"""Runs the kernel once on every GPU-suite shape and view; meant to run under compute-sanitizer.

    compute-sanitizer --tool memcheck python tests/sanitize_cases.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model_new  # noqa: E402
from cases import DTYPES, SHAPES, logits, targets, views  # noqa: E402

model = model_new.ModelNew()
runs = 0
for dtype in DTYPES.values():
    for tdtype in (torch.int64, torch.int32):
        for rows, cols in SHAPES:
            if rows * cols > 2**24:
                rows = max(1, 2**24 // cols)  # the sanitizer is slow; the code paths are the same
            t = targets(rows, cols, tdtype)
            model(logits(rows, cols, dtype), t)
            runs += 1
            if rows and cols > 1:
                for _, x in views(rows, cols, dtype):
                    model(x, t)
                    runs += 1
torch.cuda.synchronize()
print(f"sanitize_cases: {runs} launches")
