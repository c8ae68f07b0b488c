"""The boundary between the host and the kernels: the launch's one parameter block, declared once.
preamble() writes it as the kernels' `struct Params` (csrc's params.h, with the constants and the
driver attributes the extension reads), and the dispatch packs it with PARAMS_STRUCT in the same
layout (native alignment, as the C++ compiler lays it out); and the workspace a launch counts in."""
import math
import struct
from collections import namedtuple

from .constants import EXACT_WORDS, KERNEL_CONSTANTS
from .gpu import DEVICE_ATTRIBUTES

# (name, C type, struct code, what it holds), in four parts, each a call's (where its tensors are, and
# its stream: packed at every call) or a problem's (fixed by the shapes, strides, dtypes, device and
# options: packed once per problem, crossent.dispatch.call). The default build reads the first three
# parts' fields as far as the stream; the options build's alone come after it, so that the default
# build's fields keep their places whatever the options add.
PARTS = (
    (  # a call's
        ("logits", "const void*", "Q", "the first logit"),
        ("targets", "const void*", "Q", "the first target"),
        ("out", "void*", "Q", "the mean: one element of the logits' dtype (float32 where float32_out)"),
        ("counter", "unsigned int*", "Q", "[0]: CTAs arrived, modulo gridDim.x; [1]: chunks claimed"),
        ("ignored_rows", "unsigned long long*", "Q", "whole rows whose target is ignore_index"),
        ("exact", "unsigned long long*", "Q", "whole rows: the losses' exact sum"),
        ("seg_partials", "float4*", "Q", "split rows: (m, s, x_t, unused) per segment"),
    ),
    (  # a problem's
        ("rows", "long long", "q", ""),
        ("cols", "long long", "q", ""),
        ("row_stride", "long long", "q", "elements from a row to the next"),
        ("target_stride", "long long", "q", "targets from a row's to the next"),
        ("items", "long long", "q", "rows x splits"),
        ("chunks", "long long", "q", "the units of work the CTAs claim"),
        ("splits", "int", "i", "rows in registers: segments per row"),
        ("seg_len", "int", "i", "... columns per segment"),
        ("group", "int", "i", "threads per item, a power of two; the one-row kernel's CTA; strided: positions a "
                              "thread"),
        ("chunk_rounds", "int", "i", "rows in registers: items per group in a chunk"),
        ("tile_rows", "int", "i", "tiles: rows per tile"),
        ("target_bytes", "int", "i", "8 (int64) or 4 (int32)"),
        # The host's: which instance (the plan's family and its compile-time choice) and how to launch it.
        ("family", "int", "i", "the kernel family: one of the kFamily constants"),
        ("sweeps", "int", "i", "tiles: kVectorSweeps, kElementSweeps or kPairSweeps"),
        ("batch_rows", "int", "i", "row batches: rows per batch"),
        ("dtype", "int", "i", "kFloat32, kBFloat16 or kFloat16"),
        ("grid", "int", "i", "CTAs"),
        ("device", "int", "i", "the CUDA device"),
        ("lead_256", "bool", "?", "rows in registers: the instance counted from the 256-byte grid"),
        ("evict_first", "bool", "?", "the instance with evict-first loads"),
    ),
    (  # a call's
        ("stream", "cudaStream_t", "Q", "the current stream"),
        # The options build's alone (kOptions) from here on.
        ("losses", "float*", "Q", "reduction none: a loss per row, in float32"),
        ("weight", "const void*", "Q", "class weights, C of the logits' dtype; null: none"),
        ("weight_phases", "void*", "Q", "streamed: the class weights' shifted copies that rows off their 16-byte "
                                        "grid read (streamed.cuh, row_weights); null: none"),
        ("weight_exact", "unsigned long long*", "Q", "weighted: the counted rows' weights' exact sum"),
        ("row_state", "float2*", "Q", "every row's (m, s), its max and sum of exp: its log-sum-exp m + log s, "
                                      "which the gradient reads; null: not asked"),
        ("probs", "const void*", "Q", "streamed: probability targets, the logits' shape; null: class indices"),
        # The gradient's (kFamilyGradient); the fused family's too: grad, grad_out, weight_total.
        ("grad", "void*", "Q", "d loss / d logits, the logits' dtype, rows grad_row_stride elements apart"),
        ("grad_out", "void*", "Q", "the loss's incoming gradient in grad_dtype: one, or one a row; a fused "
                                   "launch of the mean (and a split merge) stores its 1 / divisor there, in float32"),
        ("grad_scale", "const float*", "Q", "the mean's 1 / divisor, which grad_out's gradient is multiplied by; "
                                            "null: 1"),
        ("grad_lse", "const float*", "Q", "the log-sum-exp's incoming gradient, one a row; null: none"),
        ("weight_total", "const float*", "Q", "the class weights' sum, where label smoothing weighs every class"),
        ("grad_probs", "void*", "Q", "d loss / d probabilities, their dtype, laid out as grad; null: not asked"),
        ("grad_in", "const void*", "Q", "after a fused forward: the loss's incoming gradient as given, in "
                                        "grad_dtype; rows where it is 1 hold theirs. null: none"),
        # A split vocabulary's (kFamilySplitTerms, kFamilySplitMerge).
        ("terms", "float2*", "Q", "each row's (lse_r, u_r) over a rank's classes: the terms kernel's for its "
                                  "rank, the merge's input for every rank (ranks x rows)"),
        ("lse", "float*", "Q", "the merge's: every row's log-sum-exp over all the classes"),
    ),
    (  # a problem's
        ("ignore_index", "long long", "q", "targets to skip"),
        ("reduction", "int", "i", "kReductionMean, kReductionSum or kReductionNone"),
        ("float32_out", "bool", "?", "the result (out) in float32 rather than the logits' dtype"),
        ("z_loss", "float", "f", "adds z_loss * lse^2 to each counted row's loss"),
        ("label_smoothing", "float", "f", "eps: label smoothing's share of each row's loss"),
        ("smoothing_per_class", "float", "f", "eps / C"),
        ("probs_stride", "long long", "q", "... elements from a sample's to the next"),
        ("class_stride", "long long", "q", "streamed: elements from a class to the next (d1 * ... * dk; 1: "
                                           "contiguous)"),
        ("probs_dtype", "int", "i", "kFloat32, the logits' dtype, or kClassIndices"),
        ("grad_dtype", "int", "i", "grad_out's and grad_in's: kFloat32, kBFloat16 or kFloat16"),
        ("softcap", "float", "f", "streamed: each logit x read as softcap * tanh(x / softcap); 0: as it is"),
        ("softcap_rate", "float", "f", "... 2 log2(e) / softcap"),
        ("grad_row_stride", "long long", "q", "the gradient's: elements from a row to the next (the logits' "
                                              "class_stride and the same positions)"),
        ("class_start", "long long", "q", "the gradient's and a split's terms: the first class the columns hold, of "
                                          "`classes`"),
        ("classes", "long long", "q", "... the classes of a vocabulary split across ranks, targets among them all; "
                                      "0: not split (the columns are the classes)"),
        ("ranks", "int", "i", "the merge's: the ranks whose terms it reads"),
    ),
)
PARAMS = sum(PARTS, ())
Params = namedtuple("Params", [name for name, *_ in PARAMS])
PARAMS_STRUCT = struct.Struct("@" + "".join(code for _, _, code, _ in PARAMS) + "0q")  # padded as C pads
# Each part packed alone: a call's part is 8-byte words, and a problem's is padded to 8 bytes as C pads
# it ahead of the next word, so that the parts joined are the block.
CALL_PARTS = tuple(struct.Struct("@" + "".join(code for _, _, code, _ in part)) for part in PARTS[0::2])
PROBLEM_PARTS = tuple(struct.Struct("@" + "".join(code for _, _, code, _ in part) + "0q") for part in PARTS[1::2])
assert all(code == "Q" for part in PARTS[0::2] for _, _, code, _ in part)
assert sum(s.size for s in CALL_PARTS + PROBLEM_PARTS) == PARAMS_STRUCT.size

NO_PARAMS = Params._make(0 for _ in PARAMS)  # a launch's fields that it leaves unread


def preamble(options=False):
    """params.h as the CUDA and C++ sources include it: the constants and the parameter block;
    `options`: the build that also reads the options' fields (kOptions)."""
    constants = "\n".join(f"constexpr int {name} = {value};" for name, value in KERNEL_CONSTANTS.items())
    fields = "\n".join(f"  {ctype} {name};" + (f"  // {doc}" if doc else "") for name, ctype, _, doc in PARAMS)
    attributes = ", ".join(attribute for _, attribute in DEVICE_ATTRIBUTES)
    return (f"// params.h, generated by crossent.params from KERNEL_CONSTANTS, PARAMS and DEVICE_ATTRIBUTES.\n"
            f"#include <cuda_runtime.h>\n\n{constants}\nconstexpr bool kOptions = {str(options).lower()};\n\n"
            f"struct Params {{\n{fields}\n}};\n\n"
            f"constexpr cudaDeviceAttr kDeviceAttributes[] = {{{attributes}}};\n")


def workspace_layout(splits, rows, phase_bytes=0):
    """Byte offsets of the exact sum, the weights' exact sum, the segment partials and the class
    weights' shifted copies, and the bytes in all. The counters fill the first 16 bytes (CTAs
    arrived, chunks claimed, rows ignored: 64-bit), each exact sum's words the next 80 (16-byte
    loads), rows split into `splits` segments (a plan's; 1: whole rows) have an (m, s, x_t) partial
    per segment, and phase_bytes (policy.weight_phase_bytes) follow, on the 16-byte grid."""
    exact_off = 16
    weight_off = exact_off + 8 * EXACT_WORDS
    seg_off = weight_off + 8 * EXACT_WORDS
    phase_off = seg_off + (16 * rows * splits if splits > 1 else 0)
    return exact_off, weight_off, seg_off, phase_off, phase_off + phase_bytes


def softcap_rate(softcap):
    """Params.softcap_rate of a cap (0: none): 2 log2(e) / softcap, the factor of the cap's exp2."""
    return 2 / math.log(2) / softcap if softcap else 0.0
