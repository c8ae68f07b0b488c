"""The submission passes KernelBench's static checker with no errors and no warnings."""
import pytest

from conftest import read
from static_rules import findings


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_model_new_is_clean(precision):
    errors, warnings = findings(read("model_new.py"), precision)
    assert errors == [] and warnings == []


@pytest.mark.parametrize("snippet, kind", [
    ('"""one single pass over the data"""', "errors"),
    ("x = 1  # a single pass is fine in a comment", None),
    ("s = '// pass'", None),
    ("try:\n    x = 1\nexcept ValueError:\n    x = 2", "errors"),
    ("y = torch.nn.functional.cross_entropy(a, b)", "warnings"),
    ("y = torch.logsumexp(a, 1)", "warnings"),
    ("h = __float2half_rn(x);", "warnings"),
    ("s = torch.cuda.Stream()", "warnings"),
])
def test_rules_catch_what_the_harness_rejects(snippet, kind):
    base = "load_inline\n__global__ void k() { threadIdx.x; }\n"
    errors, warnings = findings(base + snippet)
    assert bool(errors) == (kind == "errors")
    assert bool(warnings) == (kind == "warnings")


def test_submission_does_not_redefine_reference_names():
    import ast
    tree = ast.parse(read("model_new.py"))
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    clobbered = defined & {"Model", "get_inputs", "get_init_inputs", "batch_size", "num_classes",
                           "input_shape", "dim", "nn", "F"}
    assert clobbered == set()
    assert "ModelNew" in defined
    # exec'd from a string (KernelBench does so), the submission has no file of its own to read
    assert not any(isinstance(node, ast.Name) and node.id == "__file__" for node in ast.walk(tree))
