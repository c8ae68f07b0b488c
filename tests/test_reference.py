"""reference.py is KernelBench's level 1 problem 95, exactly."""
import ast
import math

import torch

from conftest import read

REF = read("reference.py")


def load():
    ns = {}
    exec(REF, ns)
    return ns


def test_constants_and_inputs():
    ns = load()
    assert (ns["batch_size"], ns["num_classes"], ns["input_shape"], ns["dim"]) == (32768, 4096, (4096,), 1)
    assert ns["get_init_inputs"]() == []
    logits, targets = ns["get_inputs"]()
    assert logits.shape == (32768, 4096) and logits.dtype == torch.float32 and logits.device.type == "cpu"
    assert 0 <= logits.min() and logits.max() < 1  # torch.rand since 2025-07-21
    assert targets.shape == (32768,) and targets.dtype == torch.int64
    assert 0 <= targets.min() and targets.max() < 4096


def test_forward_is_default_cross_entropy():
    ns = load()
    model = ns["Model"]()
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64)
    t = torch.randint(0, 5, (6,))
    out = model(x, t)
    expected = sum(math.log(sum(math.exp(v) for v in row)) - row[int(k)] for row, k in zip(x.tolist(), t)) / 6
    assert out.shape == () and abs(out.item() - expected) < 1e-12


def test_source_matches_the_problem_text():
    tree = ast.parse(REF)
    names = [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    assert names == ["Model", "get_inputs", "get_init_inputs"]
    assert "return torch.nn.functional.cross_entropy(predictions, targets)" in REF
    assert "return [torch.rand(batch_size, *input_shape), torch.randint(0, num_classes, (batch_size,))]" in REF
