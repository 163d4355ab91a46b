"""A tiny random BERT built offline in well under a second, for training tests.

WordPiece tokenizer trained with ``tokenizers`` on the texts, wrapped in
``PreTrainedTokenizerFast``; ``BertConfig`` hidden 32, 2 layers, 2 heads,
intermediate 64; both ``save_pretrained``. It learns an easy task in about
10 epochs at lr 3e-3 (see shared/notes/hf-offline.md).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List

from tests.support.bundles import FILLER, NEGATIVE, POSITIVE, span_corpus

_CACHED: Dict[str, Path] = {}


def build_tiny_model(directory: Path, texts: Iterable[str]) -> Path:
    """Build and save the tiny model into ``directory``; returns it."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(list(texts), trainers.WordPieceTrainer(vocab_size=500, special_tokens=special))
    from tokenizers.processors import TemplateProcessing

    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
    )
    fast.save_pretrained(directory)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, num_labels=2,
    )
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def tiny_model_path() -> Path:
    """The tiny model for this test session (built once, in a temporary directory)."""
    corpus = [" ".join(POSITIVE + NEGATIVE + FILLER)] * 3 + [w for w in POSITIVE + NEGATIVE + FILLER]
    return _cached("tiny-bert", corpus)


def tiny_span_model_path() -> Path:
    """A tiny model whose tokenizer knows the words of :func:`tests.support.bundles.easy_span_items`."""
    return _cached("tiny-span-bert", span_corpus())


def _cached(name: str, corpus: List[str]) -> Path:
    if name not in _CACHED:
        directory = Path(tempfile.mkdtemp(prefix="potato-{}-".format(name)))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        _CACHED[name] = build_tiny_model(directory, corpus)
    return _CACHED[name]
