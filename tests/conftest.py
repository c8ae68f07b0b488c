import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU visible: the GPU part of the suite runs on a GPU machine")


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()
