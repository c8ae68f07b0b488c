"""The figures the kernels and the host share: the launch's constants, written into the CUDA source as
constexpr (KERNEL_CONSTANTS, through params.preamble), and the codes of the kernel families, dtypes and
reductions that a parameter block carries. Each is declared here once; the figures behind them are in
docs/design, by the section a comment names."""
import torch

THREADS = 256            # threads per CTA ("Launch shape")
CTAS_PER_SM = 3          # resident CTAs per SM at most, the kernels' launch bounds: 85 registers a thread ...
CTAS_PER_SM_MORE_REGISTERS = 2  # ... where the code needs more (policy._more_registers)
BATCH = 8                # 16-byte loads a thread issues together, before the first is used
SHORT_TAIL = 4           # a row's last batch of at most this many vectors a thread rides along ("Loads")
TILE_TARGETS = 4         # targets a thread loads per tile
TILE_MIN_ROWS = 8        # rows of at most an eighth of a tile are staged in tiles ("Short rows")
SEG_SLAB = 2 * THREADS   # segments per row at most: the last CTA stages a row's partials at once
ROW_BATCH_LOADS = 4      # 16-byte loads a thread per batch of the row-batch kernel
ONE_ROW_THREADS = 1024   # the one-row kernel's most threads, each with a batch of the row ...
ONE_ROW_THREADS_SM75 = 512  # ... before sm_80, whose code needs more than 64 registers a thread
EXACT_WORDS = 10         # 64-bit words of the exact sum: 9 digits and the flags
STREAM_VECS = 4          # the streamed family's vectors of logits a thread at a time ("Streamed rows") ...
STREAM_WORDS = 6         # ... or, with probabilities beside them, 16-byte words of both
QUAD = 4                 # strided class indices: neighbouring positions a thread, where they share a load, ...
QUAD_CLASSES = 8         # ... their classes copied to shared memory this many at a time ...
QUAD_STAGE_BYTES = 32 << 10  # ... in stages of at most this many bytes a CTA ("Streamed rows")
GRADIENT_VECS = 4        # the gradient's 16-byte vectors a lane at a time ("The gradient")
FUSED_VECS = 8           # the fused family's 16-byte vectors a lane at most, its row in registers ...
FUSED_CLUSTER_CTAS = 16  # ... and a cluster's CTAs at most where a row takes more than a CTA: sm_90's non-portable
                         # size; the portable 8 on later GPUs, none before sm_90 ("The gradient")
SPLIT_CTAS = 1024         # a split vocabulary's row launches' CTAs at most, on every GPU (policy.split_grid)
MAX_SEG = 1 << 30        # a segment's column indices are 32-bit
IGNORE_INDEX = -100      # PyTorch's default: the default build skips it, the options build any other

# The codes a parameter block carries.
# The kernel families.
ROWS, TILES, ROW_BATCHES, ONE_ROW, STREAMED, GRADIENT, FUSED, SCALE, SPLIT_TERMS, SPLIT_MERGE, ROUND = range(11)
VECTOR_SWEEPS, ELEMENT_SWEEPS, PAIR_SWEEPS = range(3)  # how the tiles' kernel reduces a row (policy._sweeps)
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
CLASS_INDICES = -1       # a streamed launch's probs_dtype for class-index targets
REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}

KERNEL_CONSTANTS = {
    "kThreads": THREADS, "kCtasPerSm": CTAS_PER_SM, "kCtasPerSmMoreRegisters": CTAS_PER_SM_MORE_REGISTERS,
    "kBatch": BATCH, "kShortTail": SHORT_TAIL,
    "kTileTargets": TILE_TARGETS, "kTileMinRows": TILE_MIN_ROWS, "kSegSlab": SEG_SLAB, "kRowBatchLoads": ROW_BATCH_LOADS,
    "kOneRowThreads": ONE_ROW_THREADS, "kOneRowThreadsSm75": ONE_ROW_THREADS_SM75, "kExactWords": EXACT_WORDS,
    "kIgnoreIndex": IGNORE_INDEX,
    "kFamilyRows": ROWS, "kFamilyTiles": TILES, "kFamilyRowBatches": ROW_BATCHES, "kFamilyOneRow": ONE_ROW,
    "kFamilyStreamed": STREAMED, "kFamilyGradient": GRADIENT, "kGradientVecs": GRADIENT_VECS,
    "kFamilyFused": FUSED, "kFamilyScale": SCALE, "kFusedVecs": FUSED_VECS, "kFusedClusterCtas": FUSED_CLUSTER_CTAS,
    "kFamilySplitTerms": SPLIT_TERMS, "kFamilySplitMerge": SPLIT_MERGE, "kFamilyRound": ROUND,
    "kClassIndices": CLASS_INDICES, "kStreamVecs": STREAM_VECS, "kStreamWords": STREAM_WORDS, "kQuad": QUAD,
    "kQuadClasses": QUAD_CLASSES, "kQuadStageBytes": QUAD_STAGE_BYTES,
    "kVectorSweeps": VECTOR_SWEEPS, "kElementSweeps": ELEMENT_SWEEPS, "kPairSweeps": PAIR_SWEEPS,
    "kFloat32": DTYPE_CODES[torch.float32], "kBFloat16": DTYPE_CODES[torch.bfloat16],
    "kFloat16": DTYPE_CODES[torch.float16],
    "kReductionMean": REDUCTIONS["mean"], "kReductionSum": REDUCTIONS["sum"], "kReductionNone": REDUCTIONS["none"],
}
