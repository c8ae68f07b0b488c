"""The host-device boundary: one parameter block, declared once in params.PARAMS. The C++ compiler must
lay out the generated `struct Params` exactly as the dispatch packs it (CPU-only: nvcc)."""
import ast
import inspect
import re
import struct
import subprocess
import textwrap

import pytest

from conftest import NVCC
from crossent import build, dispatch, params
from crossent.constants import KERNEL_CONSTANTS
from crossent.sources import csrc_text


def packed_offsets():
    """Each field's offset in PARAMS_STRUCT's layout, and the block's size."""
    codes = [code for _, _, code, _ in params.PARAMS]
    offsets = [struct.calcsize("@" + "".join(codes[:k + 1])) - struct.calcsize("@" + codes[k])
               for k in range(len(codes))]
    return offsets, params.PARAMS_STRUCT.size


@pytest.mark.nvcc
def test_the_compiler_lays_out_params_as_the_dispatch_packs_them(tmp_path):
    names = [name for name, *_ in params.PARAMS]
    src = tmp_path / "layout.cu"
    src.write_text(params.preamble() + "#include <cstddef>\n#include <cstdio>\nint main() {\n"
                   + "".join(f'  std::printf("%zu\\n", offsetof(Params, {n}));\n' for n in names)
                   + '  std::printf("%zu\\n", sizeof(Params));\n}\n')
    exe = tmp_path / "layout"
    proc = subprocess.run([NVCC, "-std=c++17", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    *offsets, size = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()]
    assert (offsets, size) == packed_offsets()


def test_every_field_is_packed_by_name():
    """The gradient's launches build the block by field name (params.NO_PARAMS._replace), so a field they
    misspell is an error, not a shifted block; each value must fit its struct code."""
    fields = dict.fromkeys(params.Params._fields, 1)
    with pytest.raises(ValueError):
        params.NO_PARAMS._replace(gird=1)
    with pytest.raises(TypeError):
        params.Params(**{k: v for k, v in fields.items() if k != "grid"})
    with pytest.raises(struct.error):
        params.PARAMS_STRUCT.pack(*params.Params(**dict(fields, group=2**40)))


def _named_arguments(function, packer):
    """The field each argument of `function`'s call of `packer` names in its line's comment."""
    source = textwrap.dedent(inspect.getsource(function))
    call = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                and ast.unparse(node.func) == packer)
    lines = source.split("\n")
    named = []
    for argument in call.args:
        assert argument.lineno == argument.end_lineno, ast.unparse(argument)  # one line each, so each has its comment
        comment = re.search(r"#\s*(\w+)\s*$", lines[argument.lineno - 1])
        assert comment, lines[argument.lineno - 1]
        named.append(comment.group(1))
    assert len({argument.lineno for argument in call.args}) == len(call.args)  # one argument a line
    return named


def test_the_dispatch_names_every_field():
    """dispatch.pack fills the call's parts of the block (params.CALL_PARTS) and dispatch.problem_fields
    the problem's (params.PROBLEM_PARTS), one argument a line, each line naming its field in a comment:
    each part's fields in params.PARTS' order."""
    named = [_named_arguments(dispatch.pack, "CALL_PARTS[0].pack"),
             _named_arguments(dispatch.problem_fields, "PROBLEM_PARTS[0].pack"),
             _named_arguments(dispatch.pack, "CALL_PARTS[1].pack"),
             _named_arguments(dispatch.problem_fields, "PROBLEM_PARTS[1].pack")]
    assert named == [[name for name, *_ in part] for part in params.PARTS]


def test_the_calls_fields_are_its_pointers():
    """The fields packed at every call are the data pointers and the stream, and only they: every other
    field is the problem's, packed once (dispatch.problem_fields)."""
    pointers = [name for name, ctype, *_ in params.PARAMS if ctype.endswith("*") or ctype == "cudaStream_t"]
    assert pointers == [name for part in params.PARTS[0::2] for name, *_ in part]


def test_the_block_packs_in_parts_as_in_one():
    """The parts, packed apart and joined, are the block packed whole: each starts where C's layout puts
    it."""
    values = params.Params._make(range(1, len(params.PARAMS) + 1))
    parts, start = [], 0
    for part, packer in zip(params.PARTS, (params.CALL_PARTS[0], params.PROBLEM_PARTS[0], params.CALL_PARTS[1],
                                            params.PROBLEM_PARTS[1])):
        parts.append(packer.pack(*values[start:start + len(part)]))
        start += len(part)
    assert b"".join(parts) == params.PARAMS_STRUCT.pack(*values)


def test_the_binding_declares_what_the_cuda_source_defines():
    """Each csrc file declares the functions of another that it calls (module.cpp binds launch.cu's
    launch and driver figures and the training node's definitions; the node calls launch.cu's launch;
    launch.cu, the options build's families' launches) as that file defines them, parameters and all."""
    files = {name: csrc_text(name) for name in dict.fromkeys(build.CPP_FILES[True] + build.CUDA_FILES[True])}
    checked = set()
    for declarer, text in files.items():
        for result, function, declared in re.findall(r"^(\w[\w:<>*& ]*?) (\w+)\(([^)]*)\);", text, re.M):
            definitions = [(definer, defined) for definer, other in files.items()
                           for defined in re.findall(rf"^{re.escape(result)} {function}\(([^)]*)\) \{{", other, re.M)]
            assert len(definitions) == 1, (declarer, function, definitions)
            assert " ".join(declared.split()) == " ".join(definitions[0][1].split()), (declarer, function, definitions)
            checked.add((declarer, function, definitions[0][0]))
    assert {("module.cpp", "launch_cross_entropy", "launch.cu"), ("module.cpp", "device_attributes", "launch.cu"),
            ("module.cpp", "define_training", "training_node.cpp"),
            ("training_node.cpp", "launch_params", "launch.cu")} <= checked, checked


def test_the_kernels_see_the_policys_constants():
    preamble = params.preamble()
    for name, value in KERNEL_CONSTANTS.items():
        assert f"constexpr int {name} = {value};" in preamble
    assert not re.search(r"-D\w+=", " ".join(build.nvcc_flags(["-arch=sm_90"])))  # no other way in
