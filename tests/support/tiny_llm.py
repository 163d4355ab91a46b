"""Tiny random causal language models built offline in a second, for the LLM trainer's tests.

Two architecture families, so the trainer is not tested against one model's
quirks only:

- ``llama``: a ``LlamaConfig`` model (grouped-query attention, gated MLP) whose
  tokenizer has a pad token and a ChatML chat template (``<|im_start|>`` /
  ``<|im_end|>``), as instruction-tuned models ship;
- ``gpt2``: a ``GPT2Config`` model (learned positions, plain MLP) whose
  tokenizer has no pad token and no chat template, as GPT-2 ships.

Each tokenizer is a byte-level BPE trained with ``tokenizers`` on the given
texts (any text encodes; the texts' words become single tokens), wrapped in
``PreTrainedTokenizerFast``; model and tokenizer are ``save_pretrained`` into
one directory that the Auto classes load back, as a downloaded model would be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

FAMILIES = ("llama", "gpt2")
EOS = "<|endoftext|>"
PAD = "<|pad|>"
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>")
# ChatML, as Qwen's and many other instruction-tuned models' tokenizer_config.json carry it.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Small enough to train in seconds on two CPU cores, large enough to learn a keyword task.
HIDDEN, LAYERS, HEADS, POSITIONS = 64, 2, 4, 512
# Weights drawn as a trained model's are spread, not at transformers' default (std 0.02), with which a
# random model is all but deaf: each layer adds ~3 % to the residual stream, so the answer position
# sees its own token only, and the (tied, frozen) output layer keeps every logit within about 1 of 0.
# LoRA then cannot learn (measured: the loss stays at 5 nats on 8 examples; on the keyword task every
# item got the same label). Linear layers at 1/sqrt(hidden), embeddings at 1.0: LoRA learns the
# keyword task to holdout accuracy 0.92-1.0 in 200 steps (two models, three seeds).
EMBEDDING_STD = 1.0


def build_tiny_causal_lm(directory: Path, texts: Iterable[str], family: str = "llama", *,
                         vocab_size: int = 600, seed: int = 0, hidden: int = HIDDEN, layers: int = LAYERS) -> Path:
    """Build a tiny ``family`` model with a tokenizer trained on ``texts``; save both into ``directory``.

    ``hidden``/``layers`` make it larger (bench/llm_throughput.py), ``vocab_size`` caps the tokenizer's.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if family not in FAMILIES:
        raise ValueError("family must be one of {}, not {!r}".format(FAMILIES, family))
    chat = family == "llama"
    special = [EOS] + ([PAD] if chat else []) + (list(CHAT_TOKENS) if chat else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(texts), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS,
                                   pad_token=PAD if chat else None)
    if chat:
        fast.chat_template = CHATML_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)

    eos = tok.token_to_id(EOS)
    torch.manual_seed(seed)
    if chat:
        config = LlamaConfig(
            vocab_size=tok.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
            max_position_embeddings=POSITIONS, bos_token_id=eos, eos_token_id=eos,
            pad_token_id=tok.token_to_id(PAD), tie_word_embeddings=True, initializer_range=hidden ** -0.5,
        )
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=hidden, n_layer=layers, n_head=HEADS,
                            n_positions=POSITIONS, bos_token_id=eos, eos_token_id=eos,
                            initializer_range=hidden ** -0.5)
        model = GPT2LMHeadModel(config)
    model.get_input_embeddings().weight.data.normal_(0.0, EMBEDDING_STD)
    # As chat models ship: generation ends at the end of the assistant's turn too.
    model.generation_config.eos_token_id = [tok.token_to_id(CHAT_TOKENS[1]), eos] if chat else eos
    model.generation_config.pad_token_id = tok.token_to_id(PAD) if chat else eos
    model.save_pretrained(directory)
    return directory
