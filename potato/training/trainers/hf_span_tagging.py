"""``hf-span-tagging``: fine-tune a Hugging Face encoder to find labelled spans of item text.

Token classification with BIO tags over the model's own tokens: a token is
``B-<label>`` where a span begins, ``I-<label>`` inside it, ``O`` elsewhere.
Spans are character offsets into the item's text (end exclusive), and the
tokenizer's offset mapping (a fast tokenizer: ``tokenizer.json``) takes them
to tokens and back, so a predicted span is exactly the characters of its
first token's start to its last token's end — whatever the text holds
(accents, CJK, emoji, ``<``, ``&``, quotes): offsets count Python characters
(code points), the same as the bundle's.

What the tags cannot say, and what is done about it (each counted per schema
and said in the run log):

- **Overlapping gold spans.** One tag per token cannot mark a token as in two
  spans, so of two overlapping spans of an item the one that starts first
  (the longer, at the same start) is trained on and the other left out. The
  holdout still scores against every gold span, so the scores say what the
  model cannot find.
- **A span boundary inside a token** (``Paris`` of ``Parisian`` where the
  tokenizer keeps one token): the token is tagged as part of the span, so the
  model learns — and predicts — whole tokens there.
- **Texts longer than ``max_length`` tokens** are read in windows of
  ``max_length`` tokens that overlap by ``stride`` tokens, for training and
  for prediction, so a span anywhere in a long text is learnt and found. A
  token in two windows is predicted by the one where it has the more context
  on both sides (the nearer window edge is farther away). A span cut by a
  window's edge continues with ``I-`` in the next window; decoding starts a
  span at an ``I-`` that follows no span of its label, as seqeval's default
  (CoNLL) reading does.

A predicted span's ``confidence`` is the mean of its tokens' tag
probabilities (transformers' ``TokenClassificationPipeline`` with
``aggregation_strategy="simple"`` scores entities the same way). A token's
characters leave out whitespace at its edges (SentencePiece's tokens carry
the space before a word), so no predicted span begins or ends with
whitespace. The holdout is scored with :func:`potato.training.trainers.metrics.span`: exact match of start,
end and label, micro-averaged and per label.

Everything else — options, LoRA, data-parallel runs, length-grouped training
batches, token budgets for prediction, mixed precision — is
hf-text-classification's, from ``potato/training/trainers/hf_common.py``.

Part of the remote half: importing this module loads only the standard
library; torch / transformers / peft are imported inside :func:`train`.
"""

from __future__ import annotations

import bisect
import os
import re
import unicodedata
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from potato.training.answer_kinds import SPAN
from potato.training.events import TrainerFailure
from potato.training.trainers.answers import gold_answers
from potato.training.trainers.hf_common import (
    FINE_TUNE_OPTIONS,
    FineTune,
    build_model,
    check_fine_tune_options,
    describe_fit,
    estimated_tokens,
    fine_tune_options,
    pad_rows,
    safe_dirname,
    save_model,
    shard,
    start_fine_tune,
    token_budget_batches,
)
from potato.training.trainers.metrics import describe, holdout_scores
from potato.training.trainers.options import is_int
from potato.training.trainers.registry import TRAINERS
from potato.training.trainers.schedule import Validation, split_validation

NAME = "hf-span-tagging"
REQUIRED_MODULES = TRAINERS[NAME].required_modules

# stride: tokens a window shares with the next; None: a quarter of max_length.
DEFAULT_OPTIONS = dict(FINE_TUNE_OPTIONS, max_length=256, stride=None)  # type: Dict[str, Any]

OUTSIDE = "O"
IGNORE = -100  # the tag of a token that is no character of the text ([CLS], [SEP]): no loss, no span

Span = Tuple[int, int, str]  # (start, end, label): characters of the text, end exclusive


# -- options -----------------------------------------------------------------


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    options, problems = check_fine_tune_options(options, DEFAULT_OPTIONS, NAME)
    stride = options.get("stride")
    max_length = options.get("max_length", DEFAULT_OPTIONS["max_length"])
    if stride is not None and not (is_int(stride) and stride >= 0):
        problems.append("stride must be an integer of 0 or more, got {!r}".format(stride))
    elif stride is not None and is_int(max_length) and max_length > 0 and stride > max_length // 2:
        problems.append("stride must be at most half of max_length ({}), got {}: consecutive windows share "
                        "stride tokens".format(max_length // 2, stride))
    return problems


def effective_options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``options`` over the defaults; ``lora`` becomes None or a full mapping, ``learning_rate`` a number."""
    return fine_tune_options(options, DEFAULT_OPTIONS)


# -- tags and spans (pure Python) -----------------------------------------------


def tag_names(labels: Sequence[str]) -> List[str]:
    """``["O", "B-<first label>", "I-<first label>", …]``: tag ``1 + 2k`` begins label ``k``, ``2 + 2k`` continues it."""
    names = [OUTSIDE]
    for label in labels:
        names += ["B-" + label, "I-" + label]
    return names


def tokenizable(text: str) -> str:
    """``text`` with each lone surrogate (which JSON can carry and a tokenizer cannot encode) replaced by
    U+FFFD: one character for one, so every offset stays where it was."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def gold_spans(value: Any, text_length: int, labels: Sequence[str]) -> Tuple[List[Span], int]:
    """``(spans, how many were malformed)`` of a bundle item's answer for a span schema.

    A span is kept when ``0 <= start < end <= text_length`` (integers) and its
    label is one of ``labels``; duplicates are kept once. Sorted by start, the
    longer first.
    """
    spans, bad = set(), 0
    for span in value if isinstance(value, list) else []:
        try:
            start, end, label = span["start"], span["end"], str(span["label"])
        except (TypeError, KeyError):
            bad += 1
            continue
        if is_int(start) and is_int(end) and 0 <= start < end <= text_length and label in labels:
            spans.add((start, end, label))
        else:
            bad += 1
    if not isinstance(value, list) and value is not None:
        bad += 1
    return sorted(spans, key=lambda s: (s[0], -s[1], s[2])), bad


def without_overlaps(spans: Sequence[Span]) -> Tuple[List[Span], int]:
    """``(spans that BIO can tag, how many were left out)``: each span that overlaps one kept before it
    (``spans`` sorted by start, the longer first) is left out."""
    kept = []  # type: List[Span]
    for span in spans:
        if kept and span[0] < kept[-1][1]:
            continue
        kept.append(span)
    return kept, len(spans) - len(kept)


def text_offsets(offsets: Sequence[Tuple[int, int]], sequence_ids: Sequence[Optional[int]],
                 text: str) -> List[Optional[Tuple[int, int]]]:
    """Each token's characters of ``text``, None for a token that stands for none (``[CLS]``, padding,
    an empty piece, whitespace alone).

    Whitespace at a token's edges is left out: SentencePiece's tokens carry
    the space before a word (``▁Paris`` is `` Paris``), and a span never
    begins or ends with one. A token's end is moved past the combining marks
    that follow it: a normalizer that strips accents leaves a decomposed
    ``é`` (``e`` + U+0301) or an emoji's variation selector (``❤`` + U+FE0F)
    out of every token, and a span must not lose them.
    """
    out = []  # type: List[Optional[Tuple[int, int]]]
    for (start, end), seq in zip(offsets, sequence_ids):
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if seq is None or end <= start:
            out.append(None)
            continue
        while end < len(text) and unicodedata.category(text[end]).startswith("M"):
            end += 1
        out.append((start, end))
    return out


def window_tags(offsets: Sequence[Optional[Tuple[int, int]]], spans: Sequence[Span], labels: Sequence[str]) -> List[int]:
    """The tag of each token of one window (``offsets``: see :func:`text_offsets`; :data:`IGNORE` for None).

    ``spans``: non-overlapping, sorted by start. A token belongs to a span when
    they share a character; it is the span's ``B-`` when the span begins in it,
    else its ``I-`` (so a window that begins inside a span continues it). A
    token that two spans share (both boundaries inside it) goes to the span
    that begins in it.
    """
    label_index = {label: k for k, label in enumerate(labels)}
    tags = [IGNORE] * len(offsets)
    first = 0  # spans before this one end before the current token
    previous = (-1, -1)
    for k, token in enumerate(offsets):
        if token is None:
            continue
        start, end = token
        while first < len(spans) and spans[first][1] <= start:
            first += 1
        tag = 0
        for span in spans[first:]:
            if span[0] >= end:
                break
            # Byte-level tokenizers can give one character (an emoji) several tokens of the same
            # offsets: the first begins the span, the others continue it.
            begins = span[0] >= start and previous != token
            tag = 1 + 2 * label_index[span[2]] + (0 if begins else 1)
            if span[0] >= start:
                break
        tags[k] = tag
        previous = token
    return tags


def inexact_spans(spans: Sequence[Span], tokens: Sequence[Tuple[int, int]]) -> int:
    """How many of ``spans`` the tokens (``(start, end)`` of the text's tokens, sorted) cannot mark exactly:
    a boundary falls inside a token, or no token covers a character of the span."""
    ends = [end for _, end in tokens]
    count = 0
    for start, end, _ in spans:
        first = bisect.bisect_right(ends, start)  # the first token that ends after the span's start
        last = first
        while last < len(tokens) and tokens[last][0] < end:
            last += 1
        if last == first or tokens[first][0] < start or tokens[last - 1][1] > end:
            count += 1
    return count


class TokenVotes:
    """The tags predicted for one text's tokens, merged over the windows that read it.

    A token that two windows read keeps the tag of the window where it is
    farther from the window's nearer edge (it saw more context there).
    """

    def __init__(self) -> None:
        self._best = {}  # type: Dict[Tuple[int, int], Tuple[int, int, float]]

    def add(self, offsets: Sequence[Optional[Tuple[int, int]]], tags: Sequence[int], probs: Sequence[float]) -> None:
        """One window's tokens (``offsets``: see :func:`text_offsets`) with their predicted tag and its probability."""
        content = [k for k, token in enumerate(offsets) if token is not None]
        for rank, k in enumerate(content):
            context = min(rank, len(content) - 1 - rank)
            key = offsets[k]
            if key not in self._best or context > self._best[key][0]:
                self._best[key] = (context, tags[k], probs[k])

    def tokens(self) -> List[Tuple[Tuple[int, int], int, float]]:
        """``((start, end), tag, probability)`` of each token, in text order."""
        return [(key, tag, prob) for key, (_, tag, prob) in sorted(self._best.items())]


def decode_spans(tokens: Sequence[Tuple[Tuple[int, int], int, float]], labels: Sequence[str]) -> List[Dict[str, Any]]:
    """``[{"start", "end", "label", "confidence"}]`` from tokens in text order (see :meth:`TokenVotes.tokens`).

    ``B-x`` begins a span of ``x``; ``I-x`` continues the span before it when
    that is an ``x``, else begins one; ``O`` ends it. A span runs from its
    first token's start to its last token's end; its confidence is the mean of
    its tokens' probabilities.
    """
    spans = []  # type: List[Dict[str, Any]]
    current = None  # type: Optional[List[Any]]  # [start, end, label index, probabilities]

    def close() -> None:
        if current is not None:
            spans.append({"start": current[0], "end": current[1], "label": labels[current[2]],
                          "confidence": round(sum(current[3]) / len(current[3]), 5)})

    for (start, end), tag, prob in tokens:
        if tag <= 0:
            close()
            current = None
            continue
        label, inside = (tag - 1) // 2, (tag - 1) % 2 == 1
        if inside and current is not None and current[2] == label:
            current[1] = end
            current[3].append(prob)
        else:
            close()
            current = [start, end, label, [prob]]
    close()
    return spans


# -- training ------------------------------------------------------------------


def train(job: Any, events: Any) -> None:
    """Train one tagger per schema of ``job``; write predictions, scores and artifacts (as
    hf-text-classification's :func:`train`, whose docstring says what it takes and raises)."""
    opts = effective_options(job.options)
    ft = start_fine_tune(job, events, opts, NAME)  # a job that names no schema: the bundle's span schemas
    if not ft.tokenizer.is_fast:
        raise TrainerFailure(
            "The model at {} has no fast tokenizer (tokenizer.json), which {} needs to map tokens to "
            "characters: choose a model that has one".format(ft.base_dir, NAME))
    if opts["stride"] is None:
        opts["stride"] = opts["max_length"] // 4
    elif opts["stride"] > opts["max_length"] // 2:  # max_length was lowered to the model's
        opts["stride"] = opts["max_length"] // 2
        ft.say("stride is more than half of max_length {}; using {}".format(opts["max_length"], opts["stride"]),
               level="warning")
    items = job.index_items()
    ft.say(ft.model_line(len(items), extra=", stride={}".format(opts["stride"])))
    ft.each_schema(items, lambda schema, stream: _train_schema(ft, items, schema, stream))


Window = Tuple[int, List[int], List[Optional[Tuple[int, int]]]]  # (which text, token ids, offsets)


def windows_of(tokenizer: Any, texts: List[str], max_length: int, stride: int) -> List[Window]:
    """Every window of ``texts`` (``max_length`` tokens, ``stride`` shared with the next): which text it
    reads, its token ids and each token's characters (see :func:`text_offsets`)."""
    enc = tokenizer([tokenizable(text) for text in texts], truncation=True, max_length=max_length, stride=stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
    return [(n, enc["input_ids"][w], text_offsets(enc["offset_mapping"][w], enc.sequence_ids(w), texts[n]))
            for w, n in enumerate(enc["overflow_to_sample_mapping"])]


def _windows(ft: FineTune, texts: List[str]) -> List[Window]:
    return windows_of(ft.tokenizer, texts, ft.opts["max_length"], ft.opts["stride"])


def _train_schema(ft: FineTune, items: Any, schema: str, stream: Any) -> Dict[str, Any]:
    """Train, predict and save one schema's tagger; returns its holdout scores (with its learning curve when
    the options ask for one)."""
    job, opts, group = ft.job, ft.opts, ft.group
    answers = ft.answers[schema]
    labels = answers.labels
    if not labels:
        raise TrainerFailure("Schema {!r} has no labels to tag spans with".format(schema))
    labelled = gold_answers(items, answers)
    train_idx, holdout_idx = labelled.train, labelled.holdout

    texts = [items.read(i)[1] for i in train_idx]
    spans, malformed, overlapping, total = [], 0, 0, 0
    for i, text in zip(train_idx, texts):
        found, bad = gold_spans(labelled.golds[i], len(text), labels)
        kept, dropped = without_overlaps(found)
        spans.append(kept)
        malformed, overlapping, total = malformed + bad, overlapping + dropped, total + len(found)
    text_of, train_ids, train_tags, tokens_of = _tagged_windows(ft, texts, spans, labels)
    inexact = sum(inexact_spans(kept, sorted(tokens_of[n])) for n, kept in enumerate(spans) if kept)
    long_texts = len(train_ids) - len(texts)  # windows past each text's first
    ft.say("Schema {!r}: {} training items ({} spans), {} held out, labels {}".format(
        schema, len(train_idx), total, len(holdout_idx), ", ".join(labels)))
    _say_what_tags_cannot(ft, schema, malformed, overlapping, inexact, long_texts, len(texts))

    windows = (text_of, train_ids, train_tags)
    model = _fit(ft, schema, labels, windows, texts, spans, train_idx, train_idx)

    ft.events.check_cancelled()
    predict_idx = labelled.to_predict(items, job.include_unlabeled)
    is_holdout = set(holdout_idx)
    held = {}  # type: Dict[int, List[Span]]
    for i, item_id, found in predict(model, ft, items, predict_idx, labels, schema):
        stream.write({"id": item_id, "schema": schema, "spans": found})
        if i in is_holdout:
            held[i] = [(s["start"], s["end"], s["label"]) for s in found]
    gold = [gold_spans(labelled.golds[i], items.text_lengths[i], labels)[0] for i in holdout_idx]
    scores = _scored(ft, held, holdout_idx, gold, labels)
    if group.is_main:
        out_dir = os.path.join(job.artifacts_dir, safe_dirname(schema))
        save_model(model, ft, out_dir, {"trainer": NAME, "schema": schema, "labels": labels,
                                        "tags": tag_names(labels), "stride": opts["stride"]})
        ft.say("Schema {!r}: {}; model saved to {}".format(schema, describe(schema, scores), out_dir))
    if opts["curve"] and holdout_idx:
        del model

        def curve_point(share: float, subset: List[int]) -> Dict[str, Any]:
            tagger = _fit(ft, schema, labels, windows, texts, spans, train_idx, subset, share)
            found = {i: [(s["start"], s["end"], s["label"]) for s in spans_of]
                     for i, _, spans_of in predict(tagger, ft, items, holdout_idx, labels, schema)}
            return _scored(ft, found, holdout_idx, gold, labels)

        scores["curve"] = ft.learning_curve(schema, train_idx, scores, SPAN, curve_point)
    return scores


def _fit(ft: FineTune, schema: str, labels: List[str], windows: Tuple[List[int], List[List[int]], List[List[int]]],
         texts: List[str], spans: List[List[Span]], train_idx: List[int], chosen: List[int],
         curve: Optional[float] = None) -> Any:
    """A tagger trained on the items ``chosen`` of ``train_idx`` (whose ``texts``, gold ``spans`` and tagged
    ``windows`` are given), a validation share carved from them; ``curve``: a point of the learning curve."""
    from transformers import AutoModelForTokenClassification

    text_of, train_ids, train_tags = windows
    fit_idx, val_idx = split_validation(chosen, ft.opts)
    position = {i: n for n, i in enumerate(train_idx)}
    fit_texts = {position[i] for i in fit_idx}
    fit_windows = [w for w, n in enumerate(text_of) if n in fit_texts]
    model = build_model(AutoModelForTokenClassification, "TOKEN_CLS", ft, tag_names(labels))
    fit_ids, fit_tags = [train_ids[w] for w in fit_windows], [train_tags[w] for w in fit_windows]
    validate = _validation(ft, [texts[position[i]] for i in val_idx], [spans[position[i]] for i in val_idx], labels)
    model = ft.train(model, [len(ids) for ids in fit_ids], _batch_loss(fit_ids, fit_tags, ft), schema,
                     validate, "span F1", curve=curve)
    if curve is None:
        ft.say("Schema {!r}: {}".format(schema, describe_fit(ft, len(fit_idx), len(val_idx))))
    return model


def _scored(ft: FineTune, held: Dict[int, List[Span]], holdout_idx: List[int], gold: List[List[Span]],
            labels: List[str]) -> Dict[str, Any]:
    held = ft.gather(held)
    return holdout_scores(gold, [held[i] for i in holdout_idx], SPAN, labels)


def _tagged_windows(ft: FineTune, texts: List[str], spans: List[List[Span]], labels: List[str]
                    ) -> Tuple[List[int], List[List[int]], List[List[int]], List[set]]:
    """Each window of ``texts``: which text it reads, its token ids and tags (from each text's ``spans``);
    and the tokens of each text."""
    tokens_of = [set() for _ in texts]  # type: List[set]
    text_of, ids_of, tags_of = [], [], []  # type: List[int], List[List[int]], List[List[int]]
    for n, ids, offsets in _windows(ft, texts):
        text_of.append(n)
        ids_of.append(ids)
        tags_of.append(window_tags(offsets, spans[n], labels))
        tokens_of[n].update(token for token in offsets if token is not None)
    return text_of, ids_of, tags_of, tokens_of


def _validation(ft: FineTune, texts: List[str], spans: List[List[Span]], labels: List[str]) -> Optional[Any]:
    """The training loop's ``validate`` on the validation share's ``texts`` (None without one): span F1 of
    the decoded spans against ``spans``, and the mean loss per tagged token."""
    if not texts:
        return None
    import torch
    import torch.nn.functional as F

    windows = _windows(ft, texts)
    tags = [window_tags(offsets, spans[n], labels) for n, _, offsets in windows]
    order = sorted(range(len(windows)), key=lambda w: len(windows[w][1]), reverse=True)
    batches = token_budget_batches(order, lambda w: len(windows[w][1]), ft.dev.predict_budget, ft.dev.predict_rows)
    tagged = max(1, sum(1 for row in tags for t in row if t != IGNORE))

    def validate(model: Any) -> Validation:
        votes = [TokenVotes() for _ in texts]
        loss = 0.0
        for batch in batches:
            logits = ft.logits(model, [windows[w][1] for w in batch]).float()
            y = ft.dev.put(pad_rows([tags[w] for w in batch], IGNORE, ft.dev.pad_multiple))
            loss += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE,
                                          reduction="sum"))
            prob, tag = torch.softmax(logits, dim=-1).max(dim=-1)
            for w, p, t in zip(batch, prob.cpu().tolist(), tag.cpu().tolist()):
                votes[windows[w][0]].add(windows[w][2], t, p)
        found = [[(s["start"], s["end"], s["label"]) for s in decode_spans(v.tokens(), labels)] for v in votes]
        f1 = holdout_scores(spans, found, SPAN, labels).get("f1") or 0.0
        return Validation(f1, loss / tagged, f1)

    return validate


def _say_what_tags_cannot(ft: FineTune, schema: str, malformed: int, overlapping: int, inexact: int,
                          long_texts: int, texts: int) -> None:
    """The run log's lines on the training spans that BIO tags over tokens cannot hold as they are."""
    def spans(n: int, one: str = "", many: str = "") -> str:
        return "1 gold span" + one if n == 1 else "{} gold spans{}".format(n, many)

    if malformed:
        ft.say("Schema {!r}: {} left out: not inside the item's text, or with a label the schema does not "
               "have".format(schema, spans(malformed)), level="warning")
    if overlapping:
        ft.say("Schema {!r}: {} left out of training: {} an earlier span of its item, and a token has one tag "
               "(the holdout still scores {})".format(
                   schema, spans(overlapping), "it overlaps" if overlapping == 1 else "each overlaps",
                   "it" if overlapping == 1 else "them"), level="warning")
    if inexact:
        ft.say("Schema {!r}: {} inside a token of the model's tokenizer; the model learns and predicts whole "
               "tokens there".format(schema, spans(inexact, " begins or ends", " begin or end")), level="warning")
    if long_texts:
        ft.say("Schema {!r}: texts longer than max_length {} tokens are read in windows of {} tokens "
               "overlapping by {} ({} windows for {} texts)".format(
                   schema, ft.opts["max_length"], ft.opts["max_length"], ft.opts["stride"],
                   long_texts + texts, texts))


def _batch_loss(train_ids: List[List[int]], train_tags: List[List[int]], ft: FineTune):
    """The loop's ``batch_loss``: cross-entropy of the windows ``mine``' tagged tokens, a share of the mean
    over every tagged token of the step (transformers' token-classification loss)."""
    import torch.nn.functional as F

    tagged = [sum(1 for t in tags if t != IGNORE) for tags in train_tags]

    def batch_loss(model: Any, mine: List[int], step: List[int], weight: float) -> Any:
        logits = ft.logits(model, [train_ids[k] for k in mine])
        y = ft.dev.put(pad_rows([train_tags[k] for k in mine], IGNORE, ft.dev.pad_multiple))
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=IGNORE, reduction="sum")
        return loss * (weight / max(1, sum(tagged[k] for k in step)))

    return batch_loss


def predict(model: Any, ft: FineTune, items: Any, positions: List[int], labels: List[str],
            schema: str) -> Iterator[Tuple[int, Any, List[Dict[str, Any]]]]:
    """``(position, id, spans)`` for this process's share of the items at ``positions``.

    Items go longest first in batches of a token budget, read and tokenized
    when their turn comes (memory stays flat however many items there are);
    their windows run in batches of the same budget, and each item's spans
    are decoded once all its windows are done.
    """
    import torch

    dev, opts, events = ft.dev, ft.opts, ft.events
    mine = shard(sorted(positions, key=lambda i: items.text_lengths[i], reverse=True), ft.group)
    batches = token_budget_batches(
        mine, lambda i: estimated_tokens(items.text_lengths[i], opts["max_length"], dev.predict_pad_multiple),
        dev.predict_budget, dev.predict_rows)
    model.eval()
    with torch.inference_mode():
        for step, batch in enumerate(batches, 1):
            events.check_cancelled()
            rows = [items.read(i) for i in batch]
            windows = _windows(ft, [text for _, text in rows])
            votes = [TokenVotes() for _ in batch]
            order = sorted(range(len(windows)), key=lambda w: len(windows[w][1]), reverse=True)
            width = lambda w: len(windows[w][1]) + (-len(windows[w][1]) % dev.predict_pad_multiple)  # noqa: E731
            for chunk in token_budget_batches(order, width, dev.predict_budget, dev.predict_rows):
                logits = ft.logits(model, [windows[w][1] for w in chunk], predicting=True)
                prob, tag = torch.softmax(logits.float(), dim=-1).max(dim=-1)
                for w, p, t in zip(chunk, prob.cpu().tolist(), tag.cpu().tolist()):
                    votes[windows[w][0]].add(windows[w][2], t, p)
            for i, (item_id, text), vote in zip(batch, rows, votes):
                yield i, item_id, decode_spans(vote.tokens(), labels)
            events.progress("predict", step, len(batches), schema=schema)
            dev.release()
