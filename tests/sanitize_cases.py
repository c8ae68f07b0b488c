"""Runs the kernel once on every GPU-suite shape and view, and the streamed rows with class weights;
meant to run under compute-sanitizer.

    compute-sanitizer --tool memcheck python tests/sanitize_cases.py --both-loads
    compute-sanitizer --tool racecheck python tests/sanitize_cases.py
    compute-sanitizer --tool racecheck python tests/sanitize_cases.py --plain-loads
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import crossent  # noqa: E402
from crossent import dispatch, policy  # noqa: E402
from cases import DTYPES, SHAPES, logits, targets, views  # noqa: E402

model = crossent.ModelNew()
runs = 0
# Left to the host, all of these sizes read evict-first. --plain-loads forces plain loads, and
# --both-loads runs every case under each kind: they differ in their global loads and in the launch
# shape (_plan: group sizes, CTAs per SM). racecheck takes one kind per process: twice the launches
# outgrew the 128 GiB of host memory it had on the H100 machine.
kinds = (True, False) if "--both-loads" in sys.argv else (False,) if "--plain-loads" in sys.argv else (None,)
for evict_first in kinds:
    if evict_first is not None:
        policy._evict_first = lambda *_, forced=evict_first: forced
        dispatch.forget_problems()  # plans are kept per problem
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
# The options build's streamed rows that read class weights a vector at a time: rows on and off the
# weights' grid, and the weights off every grid (their shifted copies, streamed.cuh's row_weights).
for dtype in DTYPES.values():
    for rows, cols in ((64, 1003), (5, 4096), (3, 50257)):
        x, t = logits(rows, cols, dtype), targets(rows, cols)
        probs = torch.softmax(logits(rows, cols, torch.float32), 1).to(dtype)
        for w in (torch.rand(cols, device="cuda").to(dtype), torch.rand(cols + 1, device="cuda").to(dtype)[1:]):
            crossent.cross_entropy(x, t, w, label_smoothing=0.1)
            crossent.cross_entropy(x, probs, w)
            runs += 2
torch.cuda.synchronize()
print(f"sanitize_cases: {runs} launches")
