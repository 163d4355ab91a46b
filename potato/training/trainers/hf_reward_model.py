"""``hf-reward-model``: an encoder that scores a response, trained on which of two responses annotators preferred.

A pairwise schema's item holds a prompt (the item's text) and two responses
(the bundle's ``sides``); its answer is how many annotators preferred each,
and how many neither (``potato.annotations.aggregation``). The model reads
the prompt and one response as a text pair and gives one number, the
response's reward; the probability that annotators prefer B is
``sigmoid(reward(B) - reward(A))`` (Bradley–Terry). It is trained on the
annotators' own share, ``(B + tie / 2) / all``, with a binary cross-entropy on
the difference: a 3–0 preference pulls harder than a 2–1 one, and a tie asks
for two equal rewards. (TRL's ``RewardTrainer`` trains the same loss on hard
choices: ``-log sigmoid(chosen - rejected)``.)

The model is ``AutoModelForSequenceClassification`` with one output, so the
saved artifact loads as a reward model does elsewhere: the reward of
``(prompt, response)`` is its logit. Its batches are length-grouped and
padded per batch, both sides of an item in one forward pass, dropout off
(each side's own mask would add its noise to the difference); the schedule,
validation share and best epoch are the fine-tune's
(``potato.training.trainers.schedule``), the epoch kept the one of least
validation loss (the run log shows its agreement with the majority's side).

Predictions: for every item with two responses, ``label`` (``A`` or ``B``,
the side the model prefers), ``confidence`` (its probability), ``probs``
(``[A, B]``) and ``rewards`` (each side's score). Holdout: the agreement with
the held-out items' majority and with each of their annotators
(``potato.training.trainers.metrics.comparison``).

A best–worst schema's item is a tuple of texts (the bundle's ``sides``, in
position order) and its answer how many annotators picked each position as
the best and as the worst. The same model scores each text alone; it learns
the pairs a pick implies — the best over each other text, each other text
over the worst — each with the Bradley–Terry loss, each tuple weighing as
much as any other. (Best and worst are counted apart, so an annotator's best
over their own worst is implied by both picks and weighs twice.) Its prediction for a tuple: ``label`` (the best: the
highest score) and ``worst`` (the lowest), ``probs`` (each position's chance
of being picked best, the softmax of the scores), ``confidence`` (the
best's) and ``rewards``; its holdout, the agreement with the annotators'
most-picked best and worst (``potato.training.trainers.metrics.best_worst``).

A ranking schema's item has a text for each of the schema's labels (the
bundle's ``sides``, in the labels' order) and a prompt (the bundle's
``prompts``, else the item's text; ``potato.items.ranking_texts`` says where
each comes from); its answer is each annotator's order. The model scores
``(prompt, text)`` and learns the pairs each order implies — every label over
each one below it — with the Bradley–Terry loss, each item weighing as much
as any other. Its prediction: ``order`` (the labels by score, highest first),
``label`` (the first), ``probs`` (each label's chance of being put first, the
softmax of the scores), ``confidence`` (the first's) and ``rewards``; its
holdout, the share of the held-out annotators' pairs its order agrees with,
Kendall's tau and Spearman's rho with their Borda count
(``potato.training.trainers.metrics.ranking``), beside ``baseline_agreement``:
that share for the one order the training answers' Borda count gives the
labels, the same for every item (what a model that learnt nothing of the
texts would predict).

Part of the remote half: importing this module loads only the standard
library; torch / transformers / peft are imported inside :func:`train`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

from potato.training.answer_kinds import BEST, COMPARISON, RANKING, SIDES, WORST, borda_order
from potato.training.trainers.answers import gold_answers
from potato.training.trainers.hf_common import (
    FINE_TUNE_OPTIONS,
    FineTune,
    build_model,
    check_fine_tune_options,
    describe_fit,
    fine_tune_options,
    safe_dirname,
    save_model,
    shard,
    start_fine_tune,
    token_budget_batches,
)
from potato.training.trainers.metrics import KINDS, holdout_scores
from potato.training.trainers.metrics import ranking as ranking_scores
from potato.training.trainers.registry import TRAINERS
from potato.training.trainers.schedule import Validation, split_validation

NAME = "hf-reward-model"
REQUIRED_MODULES = TRAINERS[NAME].required_modules
DEFAULT_OPTIONS = dict(FINE_TUNE_OPTIONS)  # type: Dict[str, Any]
# What the saved model's score is, for its labels.json and the Hub card.
SCORE_MEANING = ("the logit of (prompt, response) is the response's reward; sigmoid(reward(B) - reward(A)) "
                 "is the probability that annotators prefer B")
TUPLE_SCORE_MEANING = ("the logit of a text is its score; the text of the highest score in a tuple is the one "
                       "predicted best, of the lowest the one predicted worst, and sigmoid(score(x) - score(y)) is "
                       "the probability that annotators rank x above y")
RANKING_SCORE_MEANING = ("the logit of (prompt, the text a label stands for) is its score; the labels in descending "
                         "order of score are the predicted order, and sigmoid(score(x) - score(y)) is the probability "
                         "that annotators rank x above y")


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    return check_fine_tune_options(options, DEFAULT_OPTIONS, NAME)[1]


def train(job: Any, events: Any) -> None:
    """Train one reward model per comparison, best–worst or ranking schema of ``job``; write predictions, scores
    and artifacts."""
    ft = start_fine_tune(job, events, fine_tune_options(job.options, DEFAULT_OPTIONS), NAME)
    items = job.index_items()
    ft.say(ft.model_line(len(items)))
    ft.each_schema(items, lambda schema, stream: _train_schema(ft, items, schema, stream))


def preferred_share(counts: Dict[str, int]) -> float:
    """The annotators' share for B: ``(B + tie / 2) / all`` (the target the model's probability learns)."""
    a, b, tie = counts.get(SIDES[0], 0), counts.get(SIDES[1], 0), counts.get("tie", 0)
    return (b + tie / 2.0) / (a + b + tie)


class _Shape:
    """What one kind of schema is to this trainer: its sides, targets, predictions and the holdout's words."""

    def __init__(self, kind: str, labels: List[str]):
        self.kind, self.labels = kind, labels
        self.sides = 2 if kind == COMPARISON else len(labels)
        self.what = {COMPARISON: "comparisons", RANKING: "rankings"}.get(kind, "tuples")

    def target(self, gold: Any) -> Any:
        """A comparison's share for B; a tuple's or a ranking's implied pairs ``[(winner, loser, weight)]``."""
        return preferred_share(gold) if self.kind == COMPARISON else self.pairs(gold)

    def pairs(self, gold: Any) -> List[Tuple[int, int, float]]:
        if self.kind == RANKING:
            return order_pairs(gold, self.labels)
        return implied_pairs(gold, self.labels)

    def record(self, item_id: Any, schema: str, rewards: Tuple[float, ...]) -> Dict[str, Any]:
        if self.kind == COMPARISON:
            return prediction(item_id, schema, *rewards)
        if self.kind == RANKING:
            return order_prediction(item_id, schema, rewards, self.labels)
        return tuple_prediction(item_id, schema, rewards, self.labels)

    def predicted(self, rewards: Tuple[float, ...]) -> Any:
        """What the holdout compares: the preferred side; the ``(best, worst)`` positions; the order."""
        if self.kind == COMPARISON:
            return SIDES[1] if rewards[1] >= rewards[0] else SIDES[0]
        if self.kind == RANKING:
            return _by_score(rewards, self.labels)
        return self.labels[rewards.index(max(rewards))], self.labels[rewards.index(min(rewards))]

    def held(self, record: Dict[str, Any]) -> Any:
        if self.kind == RANKING:
            return record["order"]
        return record["label"] if self.kind == COMPARISON else (record["label"], record[WORST])

    def loss(self, rewards: Tuple[float, ...], gold: Any) -> float:
        """The Bradley–Terry loss of one item's rewards, as the training loss computes it."""
        pairs = [(1, 0, preferred_share(gold)), (0, 1, 1.0 - preferred_share(gold))] \
            if self.kind == COMPARISON else self.pairs(gold)
        return sum(weight * _softplus(rewards[loser] - rewards[winner]) for winner, loser, weight in pairs)


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def implied_pairs(gold: Dict[str, Dict[str, int]], labels: List[str]) -> List[Tuple[int, int, float]]:
    """A tuple's pairs ``(winner, loser, weight)`` by position index: each pick of a best wins over every
    other text, each pick of a worst loses to every other; the weights sum to 1."""
    index = {label: k for k, label in enumerate(labels)}
    found = {}  # type: Dict[Tuple[int, int], float]
    for role, picks in ((BEST, gold.get(BEST, {})), (WORST, gold.get(WORST, {}))):
        for label, n in picks.items():
            k = index[label]
            for other in range(len(labels)):
                if other != k:
                    pair = (k, other) if role == BEST else (other, k)
                    found[pair] = found.get(pair, 0.0) + n
    total = sum(found.values())
    return [(winner, loser, weight / total) for (winner, loser), weight in sorted(found.items())]


def order_pairs(orders: List[List[str]], labels: List[str]) -> List[Tuple[int, int, float]]:
    """An item's pairs ``(winner, loser, weight)`` by label index: in each annotator's order, each label wins
    over every label below it; the weights sum to 1."""
    index = {label: k for k, label in enumerate(labels)}
    found = {}  # type: Dict[Tuple[int, int], float]
    for order in orders:
        for i, winner in enumerate(order):
            for loser in order[i + 1:]:
                pair = (index[winner], index[loser])
                found[pair] = found.get(pair, 0.0) + 1
    total = sum(found.values())
    return [(winner, loser, weight / total) for (winner, loser), weight in sorted(found.items())]


def _by_score(rewards: Tuple[float, ...], labels: List[str]) -> List[str]:
    """The labels by score, highest first (equal scores in the schema's order)."""
    return [labels[k] for k in sorted(range(len(labels)), key=lambda k: (-rewards[k], k))]


def label_order_baseline(train: List[List[List[str]]], holdout: List[List[List[str]]],
                         labels: List[str]) -> Optional[float]:
    """The held-out pairwise agreement of one order for every item: the Borda count of every training order."""
    if not train or not holdout:
        return None
    order = borda_order([said for orders in train for said in orders], labels)[0]
    found = ranking_scores(holdout, [order] * len(holdout), labels)["agreement"]
    return None if found is None else round(found, 4)


def _train_schema(ft: FineTune, items: Any, schema: str, stream: Any) -> Dict[str, Any]:
    answers = ft.answers[schema]
    shape = _Shape(answers.kind, answers.labels)
    labelled = gold_answers(items, answers)
    pairs = _Pairs(ft, items, schema, shape.sides)
    train = [i for i in labelled.train if pairs.has(i)]
    holdout = [i for i in labelled.holdout if pairs.has(i)]
    ft.say("Schema {!r}: {} training {}, {} held out, {}".format(
        schema, len(train), shape.what, len(holdout), answers.describe()))
    golds = labelled.golds
    model = _fit(ft, pairs, shape, schema, train, golds)

    held = {}  # type: Dict[int, Any]
    is_holdout = set(holdout)
    to_predict = [i for i in labelled.to_predict(items, ft.job.include_unlabeled) if pairs.has(i)]
    for i, rewards in _rewards(model, ft, pairs, shard(to_predict, ft.group), schema):
        record = shape.record(items.read(i)[0], schema, rewards)
        if i in is_holdout:
            held[i] = shape.held(record)
        stream.write(record)
    held = ft.gather(held)
    scores = holdout_scores([golds[i] for i in holdout], [held[i] for i in holdout], shape.kind, answers.labels)
    if shape.kind == RANKING:
        scores["baseline_agreement"] = label_order_baseline([golds[i] for i in train], [golds[i] for i in holdout],
                                                            answers.labels)
    if ft.group.is_main:
        out_dir = os.path.join(ft.job.artifacts_dir, safe_dirname(schema))
        meaning = {COMPARISON: SCORE_MEANING, RANKING: RANKING_SCORE_MEANING}.get(shape.kind, TUPLE_SCORE_MEANING)
        save_model(model, ft, out_dir, {"trainer": NAME, "schema": schema, "labels": answers.labels,
                                        "score": meaning})
        ft.say("Schema {!r}: holdout {}; model saved to {}".format(schema, scores, out_dir))
    if ft.opts["curve"] and holdout:
        del model

        def curve_point(share: float, part: List[int]) -> Dict[str, Any]:
            fitted = _fit(ft, pairs, shape, schema, part, golds, share)
            found = ft.gather({i: shape.predicted(rewards) for i, rewards in
                               _rewards(fitted, ft, pairs, shard(holdout, ft.group), schema, False)})
            return holdout_scores([golds[i] for i in holdout], [found[i] for i in holdout], shape.kind, answers.labels)

        scores["curve"] = ft.learning_curve(schema, train, scores, shape.kind, curve_point)
    return scores


def _fit(ft: FineTune, pairs: "_Pairs", shape: _Shape, schema: str, train: List[int], golds: Dict[int, Any],
         curve: Optional[float] = None) -> Any:
    """A reward model trained on the comparisons ``train``, its epoch chosen on a validation share of them."""
    fit_idx, val_idx = split_validation(train, ft.opts)
    model = build_model(_sequence_classifier(), "SEQ_CLS", ft, ["reward"])
    _without_dropout(model)
    targets = {i: shape.target(golds[i]) for i in fit_idx}
    model = ft.train(model, [pairs.length(i) for i in fit_idx], _batch_loss(ft, pairs, shape, fit_idx, targets),
                     schema, _validation(ft, pairs, shape, val_idx, golds), KINDS[shape.kind].main.name, curve=curve)
    if curve is None:
        ft.say("Schema {!r}: {}".format(schema, describe_fit(ft, len(fit_idx), len(val_idx))))
    ft.events.check_cancelled()
    return model


def prediction(item_id: Any, schema: str, reward_a: float, reward_b: float) -> Dict[str, Any]:
    """The predictions.jsonl line for one comparison from its two rewards."""
    gap = reward_b - reward_a
    p_b = 1.0 / (1.0 + math.exp(-gap)) if abs(gap) < 700 else float(gap > 0)  # exp overflows past 709
    label = SIDES[1] if p_b >= 0.5 else SIDES[0]
    return {"id": item_id, "schema": schema, "label": label, "confidence": round(max(p_b, 1.0 - p_b), 6),
            "probs": [round(1.0 - p_b, 6), round(p_b, 6)], "rewards": [round(reward_a, 6), round(reward_b, 6)]}


def tuple_prediction(item_id: Any, schema: str, rewards: Tuple[float, ...], labels: List[str]) -> Dict[str, Any]:
    """The predictions.jsonl line for one tuple from its texts' scores."""
    top = max(rewards)
    weights = [math.exp(r - top) for r in rewards]
    probs = [w / sum(weights) for w in weights]
    best, worst = rewards.index(top), rewards.index(min(rewards))
    return {"id": item_id, "schema": schema, "label": labels[best], WORST: labels[worst],
            "confidence": round(probs[best], 6), "probs": [round(p, 6) for p in probs],
            "rewards": [round(r, 6) for r in rewards]}


def order_prediction(item_id: Any, schema: str, rewards: Tuple[float, ...], labels: List[str]) -> Dict[str, Any]:
    """The predictions.jsonl line for one ranking item from its labels' scores."""
    record = tuple_prediction(item_id, schema, rewards, labels)
    del record[WORST]
    order = _by_score(rewards, labels)
    record.update(label=order[0], order=order)
    return record


def _without_dropout(model: Any) -> None:
    """Dropout off: the loss compares two forward passes, and each pass's own dropout mask would put its noise
    into their difference twice (TRL's RewardTrainer turns it off too)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _sequence_classifier() -> Any:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification


class _Pairs:
    """Each item's token lists, one per side, ``(prompt, response)`` pairs (a tuple's texts have no prompt; a
    ranking's prompt may be its own, the bundle's ``prompts``), tokenized once when first asked for."""

    def __init__(self, ft: FineTune, items: Any, schema: str, sides: int):
        self.ft, self.items, self.schema, self.sides = ft, items, schema, sides
        self.ids = {}  # type: Dict[int, Tuple[List[int], ...]]

    def has(self, position: int) -> bool:
        return self._sides(position) is not None

    def _sides(self, position: int) -> Optional[Tuple[str, List[str]]]:
        item = self.items.record(position)
        sides = (item.get("sides") or {}).get(self.schema)
        if not (isinstance(sides, list) and len(sides) == self.sides and all(isinstance(s, str) for s in sides)):
            return None
        prompt = (item.get("prompts") or {}).get(self.schema)
        return (prompt if isinstance(prompt, str) else str(item.get("text") or "")), sides

    def tokens(self, position: int) -> Tuple[List[int], ...]:
        found = self.ids.get(position)
        if found is None:
            prompt, sides = self._sides(position)
            max_length = self.ft.opts["max_length"]
            if prompt.strip():
                enc = self.ft.tokenizer([prompt] * len(sides), sides, truncation="longest_first",
                                        max_length=max_length)
            else:
                enc = self.ft.tokenizer(sides, truncation=True, max_length=max_length)
            found = self.ids[position] = tuple(enc["input_ids"])
        return found

    def length(self, position: int) -> int:
        return max(map(len, self.tokens(position)))


def _side_seqs(pairs: _Pairs, rows: List[int]) -> List[List[int]]:
    """The rows' token lists side by side: every row's first side, then every row's second, …"""
    return [pairs.tokens(i)[side] for side in range(pairs.sides) for i in rows]


def _batch_loss(ft: FineTune, pairs: _Pairs, shape: _Shape, positions: List[int], targets: Dict[int, Any]):
    """The loop's ``batch_loss``: the Bradley–Terry loss on the items ``mine``, a share of the step's mean."""
    import torch

    def batch_loss(model: Any, mine: List[int], step: List[int], weight: float) -> Any:
        rows = [positions[k] for k in mine]
        rewards = ft.logits(model, _side_seqs(pairs, rows)).float().squeeze(-1).view(pairs.sides, len(rows))
        if shape.kind == COMPARISON:
            margin = rewards[1] - rewards[0]  # B over A
            y = ft.dev.put(torch.tensor([targets[i] for i in rows], dtype=torch.float32))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(margin, y, reduction="sum")
        else:
            implied = [(row, winner, loser, w) for row, i in enumerate(rows) for winner, loser, w in targets[i]]
            row, winner, loser, w = (ft.dev.put(torch.tensor(column)) for column in zip(*implied))
            margin = rewards[winner, row] - rewards[loser, row]
            loss = (torch.nn.functional.softplus(-margin) * w.float()).sum()
        return loss * (weight / len(step))

    return batch_loss


def _rewards(model: Any, ft: FineTune, pairs: _Pairs, positions: List[int], schema: str, progress: bool = True):
    """``(position, (reward of each side))`` for each item at ``positions``, longest first."""
    import torch

    model.eval()
    order = sorted(positions, key=pairs.length, reverse=True)
    batches = token_budget_batches(order, lambda i: pairs.sides * pairs.length(i), ft.dev.predict_budget,
                                   ft.dev.predict_rows)
    with torch.inference_mode():
        for step, batch in enumerate(batches, 1):
            ft.events.check_cancelled()
            rewards = ft.logits(model, _side_seqs(pairs, batch), predicting=True).float().squeeze(-1).cpu().tolist()
            for k, i in enumerate(batch):
                yield i, tuple(rewards[side * len(batch) + k] for side in range(pairs.sides))
            if progress:
                ft.events.progress("predict", step, len(batches), schema=schema)
    model.train()


def _validation(ft: FineTune, pairs: _Pairs, shape: _Shape, positions: List[int],
                golds: Dict[int, Any]) -> Optional[Any]:
    """The training loop's ``validate``: agreement with the validation share's majority, and the mean loss."""
    if not positions:
        return None
    main = KINDS[shape.kind].main

    def validate(model: Any) -> Validation:
        loss, predicted = 0.0, {}  # type: float, Dict[int, Any]
        for i, rewards in _rewards(model, ft, pairs, positions, "", progress=False):
            loss += shape.loss(rewards, golds[i])
            predicted[i] = shape.predicted(rewards)
        scores = holdout_scores([golds[i] for i in positions], [predicted[i] for i in positions], shape.kind,
                                shape.labels)
        # Chosen by the loss, shown as the agreement: on a validation share of a few dozen pairs the agreement
        # is 1.0 after an epoch or two, long before the rewards have learnt anything they would keep.
        return Validation(-loss / len(positions), loss / len(positions), main.of(scores) or 0.0)

    return validate
