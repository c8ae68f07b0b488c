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


@pytest.fixture(scope="module")
def model():
    import model_new
    return model_new.ModelNew()


@pytest.fixture
def policy(monkeypatch):
    """Replaces one of model_new's launch-policy functions for a test. The plans it caches per
    problem are dropped on the way in and on the way out, so that no test sees another's."""
    import model_new
    cached = model_new._plan_on  # itself replaceable

    def replace(name, value):
        monkeypatch.setattr(model_new, name, value)
        cached.cache_clear()
    yield replace
    cached.cache_clear()
