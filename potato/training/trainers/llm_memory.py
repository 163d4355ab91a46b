"""How much GPU memory fine-tuning a causal LM takes, and whether 4-bit weights work on this machine.

Read before a model is loaded, so that a run that cannot fit says so in a
second instead of failing minutes later in the middle of loading or of the
first step: :func:`estimate_training_memory` works from the model's
``config.json`` alone (its shape gives the parameter count, the layers and
the hidden size) with the run's ``batch_size`` and ``max_length``.
:func:`four_bit_support` says whether bitsandbytes can load 4-bit weights
here (importable, and on CUDA whether its kernels load).

The estimate is a sum of parts, each from the model's shape:

- the base weights: 4-bit NF4 with double quantization costs 0.52 bytes per
  parameter of the linear layers (4 bits, plus an 8-bit scale per 64 weights
  and a 32-bit one per 256 scales); the embeddings and the output layer stay
  in 16 bits, as bitsandbytes leaves them; without 4-bit, 2 bytes everywhere;
- the LoRA adapter: 16 bytes per trainable parameter (fp32 weight, gradient
  and AdamW's two moments);
- activations kept for the backward pass: per token and layer, about
  ``2 * (12 * hidden + 5 * intermediate)`` bytes (16-bit inputs of every
  linear layer, the gated MLP's three intermediates, norms and residuals;
  attention scores are not kept by PyTorch's fused attention); with gradient
  checkpointing, one 16-bit hidden state per token and layer plus one
  layer's worth recomputed;
- logits, computed on the answer tokens only (bf16, the fp32 copy the loss
  takes, its gradient): ``batch * answer tokens * vocabulary * 10`` bytes;
- the CUDA context and allocator slack: 0.75 GB plus 10 %.

For Llama-3-8B (r=16, one sequence of 512 tokens) it says 11.4 GB, and 7.6 GB
with gradient checkpointing. It is meant to tell 9 GB from 24 GB, not 9.1
from 9.3: a run on CUDA logs its estimate and, per schema, the peak it
measured, and bench/gpu_check.py prints both for a real model's shape.

Pure Python (the remote half): :func:`four_bit_support` (potato/training/probe.py,
which the ssh backend runs on a host before a run) imports bitsandbytes and
torch inside the function, when asked.
"""

from typing import Any, Dict, NamedTuple, Optional

# Whether 4-bit works is asked by the host probe too (before a remote run copies anything): its home is there.
from potato.training.probe import FourBitSupport, first_line, four_bit_support  # noqa: F401

GB = 1024 ** 3

# Models whose MLP has two matrices (up, down); the rest (Llama, Mistral, Qwen, Gemma, ...) gate it with three.
UNGATED_MLP = frozenset({
    "gpt2", "gpt_neo", "gpt_neox", "gptj", "opt", "bloom", "phi", "falcon", "starcoder2", "gpt_bigcode",
})
FOUR_BIT_BYTES = 0.52  # NF4 with double quantization, per linear-layer parameter
HALF_BYTES = 2.0
LORA_BYTES = 16.0  # fp32 weight + gradient + AdamW's two moments
LOGIT_BYTES = 10.0  # bf16 logits, the loss's fp32 copy, its gradient
CUDA_OVERHEAD_BYTES = 0.75 * GB
SLACK = 1.10


class ModelShape(NamedTuple):
    """What the estimate needs from ``config.json``."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int  # 1 unless a mixture of experts
    gated: bool
    tied: bool


def read_shape(config: Dict[str, Any]) -> ModelShape:
    """The shape of the model ``config`` (a parsed ``config.json``) describes.

    Reads the names Llama-like configs use (``hidden_size``, ``num_hidden_layers``,
    ...) and GPT-2's (``n_embd``, ``n_layer``, ...); a multimodal model's
    ``text_config`` when the language model is described there. Raises
    ``ValueError`` naming what is missing.
    """
    if "text_config" in config and "hidden_size" not in config:
        config = dict(config["text_config"], model_type=config.get("model_type", ""))

    def first(*names: str, default: Any = None) -> Any:
        for name in names:
            if isinstance(config.get(name), (int, float)) and not isinstance(config.get(name), bool):
                return int(config[name])
        if default is None:
            raise ValueError("config.json has none of {}".format(", ".join(names)))
        return default

    model_type = str(config.get("model_type") or "")
    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head")
    return ModelShape(
        model_type=model_type,
        vocab=first("vocab_size"),
        hidden=hidden,
        intermediate=first("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
        layers=first("num_hidden_layers", "n_layer", "num_layers"),
        heads=heads,
        kv_heads=first("num_key_value_heads", default=heads),
        head_dim=first("head_dim", default=hidden // heads),
        experts=first("num_local_experts", "num_experts", default=1),
        gated=model_type not in UNGATED_MLP,
        tied=bool(config.get("tie_word_embeddings", model_type in UNGATED_MLP)),
    )


def _linear_shapes(shape: ModelShape):
    """``(in, out)`` of each linear layer of one decoder layer (experts counted once each)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attention = [(h, q), (h, kv), (h, kv), (q, h)]
    mlp = [(h, shape.intermediate)] * (2 if shape.gated else 1) + [(shape.intermediate, h)]
    return attention + mlp * shape.experts


def parameter_counts(shape: ModelShape) -> Dict[str, int]:
    """``{"linear": …, "embeddings": …, "total": …}``: the parameters in linear layers (what 4-bit
    quantizes) and in the embeddings and output layer (what it leaves); norms and biases are left out."""
    linear = shape.layers * sum(i * o for i, o in _linear_shapes(shape))
    embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
    return {"linear": linear, "embeddings": embeddings, "total": linear + embeddings}


def lora_parameters(shape: ModelShape, r: int) -> int:
    """The trainable parameters of LoRA of rank ``r`` on every linear layer (peft's ``all-linear``)."""
    return shape.layers * sum(r * (i + o) for i, o in _linear_shapes(shape))


class MemoryEstimate(NamedTuple):
    """Bytes of GPU memory one training process needs, by part (see the module's docstring)."""

    weights: float
    adapter: float
    activations: float
    logits: float
    overhead: float

    @property
    def total(self) -> float:
        return (self.weights + self.adapter + self.activations + self.logits) * SLACK + self.overhead

    def describe(self) -> str:
        """``about 9.4 GB (weights 5.3, activations 2.9, LoRA 0.2, logits 0.1, CUDA 0.8)``."""
        return "about {:.1f} GB (weights {:.1f}, activations {:.1f}, LoRA {:.1f}, logits {:.1f}, CUDA {:.1f})".format(
            self.total / GB, self.weights / GB, self.activations / GB, self.adapter / GB, self.logits / GB,
            self.overhead / GB)


def estimate_training_memory(config: Dict[str, Any], *, load_in_4bit: bool, batch_size: int, max_length: int,
                             lora_r: int = 8, gradient_checkpointing: bool = False,
                             answer_tokens: int = 16) -> MemoryEstimate:
    """The GPU memory one process needs to train LoRA on the model of ``config`` (``config.json``, parsed).

    ``batch_size`` is the sequences one process holds at once (a data-parallel
    run's share of the batch), ``max_length`` their longest, ``answer_tokens``
    the longest answer (the logits are computed there only).
    """
    shape = read_shape(config)
    counts = parameter_counts(shape)
    linear_bytes = FOUR_BIT_BYTES if load_in_4bit else HALF_BYTES
    weights = counts["linear"] * linear_bytes + counts["embeddings"] * HALF_BYTES
    adapter = lora_parameters(shape, lora_r) * LORA_BYTES
    tokens = batch_size * max_length
    per_layer = HALF_BYTES * (12 * shape.hidden + 5 * shape.intermediate)
    if gradient_checkpointing:
        activations = tokens * (shape.layers * HALF_BYTES * shape.hidden + per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    logits = batch_size * (answer_tokens + 1) * shape.vocab * LOGIT_BYTES
    return MemoryEstimate(weights, adapter, activations, logits, CUDA_OVERHEAD_BYTES)


def kv_bytes_per_token(config: Dict[str, Any]) -> int:
    """Bytes the attention cache holds per token in 16 bits (keys and values of every layer)."""
    shape = read_shape(config)
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def predict_token_budget(config: Dict[str, Any], free_bytes: float) -> int:
    """Prompt tokens one prediction batch may hold on a GPU with ``free_bytes`` free (the model loaded).

    A batch holds its attention cache for every layer, and one layer's
    transient activations at a time; half the free memory goes to them, the
    rest stays for the allocator's slack and the logits.
    """
    shape = read_shape(config)
    per_token = kv_bytes_per_token(config) + HALF_BYTES * (4 * shape.hidden + 3 * shape.intermediate)
    return int(max(1024, min(65536, free_bytes * 0.5 // per_token)))


def too_little_memory_message(model: str, estimate: MemoryEstimate, free_bytes: float, device: str,
                              options: Dict[str, Any]) -> Optional[str]:
    """What to say when ``device`` has less memory free than the run needs (None when it has enough).

    ``options``: the trainer's effective options; the fix names only the
    changes that would help (no ``gradient_checkpointing: true`` when it is on).
    """
    if estimate.total <= free_bytes:
        return None
    fixes = ["lower batch_size ({}) or max_length ({})".format(options["batch_size"], options["max_length"])]
    if not options.get("gradient_checkpointing"):
        fixes.append("set gradient_checkpointing: true")
    if not options.get("load_in_4bit"):
        fixes.append("set load_in_4bit: true")
    fixes.append("use a GPU with more free memory")
    return ("{} needs {} of GPU memory to train with these options, but {} has {:.1f} GB free. "
            "Fix: {}".format(model, estimate.describe(), device, free_bytes / GB, ", ".join(fixes[:-1]) +
                             ", or " + fixes[-1]))


def out_of_gpu_memory_message(device: str, phase: str, options: Dict[str, Any]) -> str:
    """What to say when CUDA runs out of memory during a run (the worker then exits 5)."""
    if phase == "train":
        fixes = ["lower batch_size ({}) or max_length ({})".format(options["batch_size"], options["max_length"])]
        if options.get("batch_size", 1) > 1:
            fixes[0] += " (raise gradient_accumulation_steps to keep the batch the optimizer sees)"
        if not options.get("gradient_checkpointing"):
            fixes.append("set gradient_checkpointing: true")
    else:
        fixes = ["lower max_length ({}) or max_new_tokens ({})".format(options["max_length"], options["max_new_tokens"])]
    if not options.get("load_in_4bit"):
        fixes.append("set load_in_4bit: true")
    said = ", ".join(fixes[:-1]) + ", or " + fixes[-1] if len(fixes) > 1 else fixes[0]
    return "{} ran out of memory while {}. Fix: {}".format(
        device, "training" if phase == "train" else "predicting", said)


def bitsandbytes_missing_message(host: str, python: str, problem: str) -> str:
    """What to say when ``load_in_4bit: true`` meets a host whose interpreter has no working bitsandbytes."""
    return ('4-bit base weights need bitsandbytes on {}, but {} there cannot use it ({}). Fix: add "bitsandbytes" '
            "to the backend's packages (or pip install it into that interpreter), or set load_in_4bit: false"
            .format(host, python, problem))
