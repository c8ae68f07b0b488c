"""crossent: cross-entropy loss for NVIDIA GPUs at the speed of a read of the logits, forward and
backward, with every option of torch.nn.functional.cross_entropy and a few more (z-loss, logit
soft-capping, the rows' log-sum-exp, the gradient written over the logits).

    from crossent import cross_entropy
    loss = cross_entropy(logits, targets, label_smoothing=0.1)
    loss.backward()

CrossEntropyLoss is nn.CrossEntropyLoss with the same options; both take PyTorch's arguments in
PyTorch's order, and compute what the kernels do not take (CPU, float64) with PyTorch's operations.
crossent.hf puts the loss on a Hugging Face transformers model. ModelNew is the loss as KernelBench's
module, level 1 problem 95 with no arguments, which never falls back; model_new.py in the repository
is the package's kernel path bundled into the one file KernelBench loads (tools/bundle.py). The
kernels build just in time, on first use, for the GPUs present, or ahead with prebuild().
linear_cross_entropy (and LinearCrossEntropyLoss) is the loss of a linear layer's logits, x W^T + b,
made a chunk of rows at a time: a language model's head and loss without the logits of every token.
vocab_parallel_cross_entropy is the loss over classes split across ranks (torch.distributed), and
vocab_parallel_linear_cross_entropy linear_cross_entropy's with the head's classes split so."""
from .api import CrossEntropyLoss, cross_entropy
from .build import prebuild
from .linear import LinearCrossEntropyLoss, linear_cross_entropy
from .loss import ModelNew
from .parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy

__version__ = "0.1.0"
__all__ = ["CrossEntropyLoss", "LinearCrossEntropyLoss", "ModelNew", "cross_entropy", "linear_cross_entropy",
           "prebuild", "vocab_parallel_cross_entropy", "vocab_parallel_linear_cross_entropy"]
