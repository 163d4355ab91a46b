"""Best–worst scaling: the tuples Potato 2.12.1 shows, its answers as it stores them, the bundle and the checks.

With a top-level ``bws_config`` 2.12.1 serves tuples built from the items
(``bws_tuple_0001`` …, each with ``_bws_items``: ``[{source_id, text,
position}]``) and stores an answer as ``[{"schema": S, "name": "best"},
"C"]`` and ``[{"schema": S, "name": "worst"}, "A"]``: positions in the tuple.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import pytest

from potato.annotations.aggregation import best_worst_counts
from potato.annotations.annotator_answers import read_answers
from potato.bundle.build import build_bundle, describe_bundle
from potato.config import Scheme
from potato.errors import ProjectDataError
from potato.items.bws_tuples import bws_tuples
from potato.prefill.prediction_shapes import parse_prediction
from potato.scheme_fields import BwsConfig, read_bws_config
from potato.training.answer_kinds import BEST_WORST, UNSUPPORTED
from potato.training.trainers.answers import SchemaAnswers
from potato.training.trainers.hf_reward_model import implied_pairs, tuple_prediction
from potato.training.trainers.metrics import describe, holdout_scores
from tests.support.answer_project import pair, write_state
from tests.support.potato212 import VENV
from tests.support.potato_project import make_project, project_config
from tests.unit.test_config import build, seed_dict

QUALITY = Scheme("quality", "bws", ("A", "B", "C", "D"), mode="tuples")
POOL = [{"id": f"s{i}", "text": f"sentence {i}", "extra": i} for i in range(10)]

_REAL_GENERATOR = """
import json, sys
from potato.bws_tuple_generator import BwsTupleGenerator
args = json.loads(sys.argv[1])
print(json.dumps(BwsTupleGenerator(args.pop("pool"), "id", "text", **args).generate()))
"""


@pytest.mark.potato212
@pytest.mark.parametrize("pool_size, options", [
    (10, {}),
    (5, {"tuple_size": 4}),
    (13, {"tuple_size": 3, "seed": 7}),
    (40, {"tuple_size": 5, "num_tuples": 17}),
    (6, {"tuple_size": 2, "min_item_appearances": 3, "seed": 0}),
    (4, {"tuple_size": 4, "num_tuples": 9}),  # every tuple the whole pool: the refill at each pass boundary
])
def test_the_tuples_are_the_ones_potato_212_builds(potato212, tmp_path, pool_size, options):
    pool = [{"id": f"s{i}", "text": f"sentence {i}"} for i in range(pool_size)]
    real = subprocess.run([str(VENV / "bin" / "python"), "-c", _REAL_GENERATOR, json.dumps({"pool": pool, **options})],
                          capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"},
                          cwd=tmp_path)  # not the repository, whose own potato would be imported
    assert bws_tuples(pool, "id", "text", BwsConfig(**options)) == json.loads(real.stdout)


def test_tuples_are_numbered_and_cover_every_item_before_repeating_one():
    tuples = bws_tuples(POOL, "id", "text", BwsConfig())
    assert len(tuples) == 20  # ceil(10 items x 8 appearances / 4)
    assert tuples[0]["id"] == "bws_tuple_0001" and tuples[-1]["id"] == "bws_tuple_0020"
    assert tuples[0]["text"] == "" and tuples[0]["_bws_tuple_size"] == 4
    first_pass = [m["source_id"] for t in tuples[:2] for m in t["_bws_items"]] + \
        [m["source_id"] for m in tuples[2]["_bws_items"][:2]]
    assert sorted(first_pass) == sorted(item["id"] for item in POOL)
    assert all([m["position"] for m in t["_bws_items"]] == ["A", "B", "C", "D"] for t in tuples)


def test_a_pool_smaller_than_a_tuple_is_refused():
    with pytest.raises(ValueError, match="bws_config.tuple_size is 4, more than the 3 items of the data"):
        bws_tuples(POOL[:3], "id", "text", BwsConfig())


@pytest.mark.parametrize("raw, problems", [
    ({"tuple_size": 1}, [("tuple_size", "is 1; use a whole number of at least 2")]),
    ({"tuple_size": 27}, [("tuple_size", "is 27; Potato labels a tuple's positions A to Z, so use at most 26")]),
    ({"seed": "x"}, [("seed", "is 'x'; use a whole number")]),
    ({"num_tuples": 0}, [("num_tuples", "is 0; use a whole number of at least 1 or leave it out")]),
    ({"min_item_appearances": True}, [("min_item_appearances", "is True; use a whole number of at least 1 or "
                                                               "leave it out")]),
    ("four", [("", "is 'four'; use a mapping, e.g. bws_config: {tuple_size: 4}")]),
])
def test_a_bad_bws_config_names_the_key(raw, problems):
    assert read_bws_config(raw) == (None, problems)


def test_config_with_a_bws_schema(tmp_path):
    raw = seed_dict()
    raw["annotation_schemes"].append({"annotation_type": "bws", "name": "quality", "description": "Which is best?"})
    result = build(tmp_path, raw)
    assert [e.message for e in result.errors] == [
        "schema 'quality' is a bws schema, and the config has no top-level bws_config, which builds the tuples it "
        "shows; add bws_config: {tuple_size: 4}"]
    raw["bws_config"] = {"tuple_size": 3, "seed": 5}
    result = build(tmp_path, raw)
    assert [w.message for w in result.warnings] == [
        "annotation_schemes[0] (scheme 'sentiment') is a radio schema beside bws_config: Potato 2.12 shows only "
        "tuples then, so its answers are about a tuple, not an item, and train as such"]
    config = result.config
    assert config.bws == BwsConfig(tuple_size=3, seed=5)
    scheme = config.scheme("quality")
    assert (scheme.kind, scheme.labels) == (BEST_WORST, ("A", "B", "C"))
    raw["model_training"]["writeback"]["schemas"] = ["quality"]
    raw["assignment_strategy"] = "model_review"  # no strategy helps: a tuple is in no data file
    assert [e.message for e in build(tmp_path, raw).errors] == [
        "model_training.writeback.schemas[0] is 'quality', a bws schema: Potato 2.12 builds its tuples when it "
        "starts and keeps them in no data file, so no prediction can reach one; its predictions stay in the run's "
        "predictions.jsonl and on its run page; remove it from writeback.schemas"]
    del raw["assignment_strategy"]
    raw["model_training"]["writeback"]["schemas"] = []
    del raw["bws_config"]
    raw["ibws_config"] = {"tuple_size": 4}
    scheme = build(tmp_path, raw).config.scheme("quality")
    assert scheme.kind == UNSUPPORTED


def _project(tmp_path):
    """POOL as a bws project with QUALITY: alice and bob answered two tuples, alice one badly."""
    make_project(tmp_path, n_items=0)
    config = project_config(tmp_path / "config.yaml")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in POOL), encoding="utf-8")
    config = replace(config, schemes=(QUALITY,), data_files=(data,), bws=BwsConfig())
    out = config.output_annotation_dir
    write_state(out, "alice", {
        "bws_tuple_0001": [pair("quality", "best", "C"), pair("quality", "worst", "A")],
        "bws_tuple_0002": [pair("quality", "best", "B"), pair("quality", "worst", "")],
        "bws_tuple_0003": [pair("quality", "best", "E"), pair("quality", "worst", "A")],
        "bws_tuple_0004": [pair("quality", "best", "D"), pair("quality", "worst", "D")],
    })
    write_state(out, "bob", {"bws_tuple_0001": [pair("quality", "best", "C"), pair("quality", "worst", "B")]})
    return config


def test_each_pick_is_read_as_a_position_and_what_is_not_one_is_named(tmp_path):
    config = _project(tmp_path)
    out = config.output_annotation_dir
    answers = read_answers(out, (QUALITY,), base=out)
    assert answers.picks == {"quality": {"bws_tuple_0001": [("C", "A"), ("C", "B")],
                                         "bws_tuple_0002": [("B", None)], "bws_tuple_0003": [(None, "A")]}}
    assert answers.warnings == [
        "alice/user_state.json: item(s) 'bws_tuple_0003' have 'E' for schema 'quality', which is not a position "
        "of its tuples (bws_config.tuple_size); those answers were skipped",
        "alice/user_state.json: item(s) 'bws_tuple_0004' have 'D' as both the best and the worst of schema "
        "'quality'; those answers were skipped",
    ]


def test_picks_are_counted_per_position():
    coded, ties = best_worst_counts({"t1": [("C", "A"), ("C", "B")], "t2": [("B", None), ("A", "D")]},
                                    ("A", "B", "C", "D"))
    assert coded.decode(coded.per_item["t1"]) == {"best": {"C": 2}, "worst": {"A": 1, "B": 1}}
    assert coded.decode(coded.per_item["t2"]) == {"best": {"A": 1, "B": 1}, "worst": {"D": 1}}
    assert ties == 1


def test_the_bundle_holds_the_tuples_their_texts_and_the_counts(tmp_path):
    config = _project(tmp_path)
    info = build_bundle(config, ["quality"], tmp_path / "bundle", holdout_fraction=0.0)
    lines = [json.loads(line) for line in (tmp_path / "bundle" / "items.jsonl").read_text().splitlines()]
    assert len(lines) == 20
    tuples = bws_tuples(POOL, "id", "text", BwsConfig())
    first = lines[0]
    assert first["id"] == "bws_tuple_0001"
    assert first["sides"] == {"quality": [m["text"] for m in tuples[0]["_bws_items"]]}
    assert first["labels"] == {"quality": {"best": {"C": 2}, "worst": {"A": 1, "B": 1}}}
    assert "quality: 3 labelled (A 0, B 1, C 1, D 0, tie 1; 0 held out, 1 ties)" in describe_bundle(info)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["answers"]["quality"] == {"type": "bws", "kind": "best_worst", "tuple_size": 4}
    assert manifest["schemas"]["quality"] == ["A", "B", "C", "D"]


def test_gold_answers_and_the_pairs_they_imply():
    answers = SchemaAnswers("quality", ["A", "B", "C"], {"kind": "best_worst"})
    assert answers.describe() == "the best and the worst of tuples of 3 (A, B, C)"
    gold = answers.gold({"best": {"C": 2}, "worst": {"A": 2}})
    assert gold == {"best": {"C": 2}, "worst": {"A": 2}}
    assert answers.gold({"best": {"E": 1}}) is None and answers.gold({"best": {}, "worst": {}}) is None
    # C over A and B (2 picks each), A under B and C (2 each): C over A twice, as best and as worst.
    assert implied_pairs(gold, answers.labels) == [(1, 0, 0.25), (2, 0, 0.5), (2, 1, 0.25)]


def test_a_tuple_prediction_and_its_holdout():
    record = tuple_prediction("t1", "quality", (0.5, 2.0, -1.0, 0.1), ["A", "B", "C", "D"])
    assert (record["label"], record["worst"]) == ("B", "C")
    assert record["probs"][1] == record["confidence"] and abs(sum(record["probs"]) - 1) < 1e-5
    kinds, labels = {"quality": BEST_WORST}, {"quality": ["A", "B", "C", "D"]}
    parsed = parse_prediction(record, kinds, labels)
    assert parsed.answer == {"best": "B", "worst": "C"}
    with pytest.raises(ValueError, match="worst is 'B', not a position of the tuples of 'quality' other than the best"):
        parse_prediction({**record, "worst": "B"}, kinds, labels)
    gold = [{"best": {"B": 2}, "worst": {"C": 1, "A": 1}}, {"best": {"A": 1}, "worst": {"D": 1}}]
    scores = holdout_scores(gold, [("B", "C"), ("C", "D")], BEST_WORST, labels["quality"])
    assert scores == {"kind": "best_worst", "n": 2, "agreement": 0.75, "best_agreement": 0.5,
                      "worst_agreement": 1.0, "annotator_agreement": 0.6667, "decided": 2}
    assert describe("quality", scores) == ("Holdout quality: best agreement with the majority 0.500, worst 1.000, "
                                           "with each annotator 0.667 (n=2)")


def test_data_too_small_for_one_tuple_is_refused_before_a_run_with_the_fix(tmp_path):
    config = _project(tmp_path)
    config.data_files[0].write_text("".join(json.dumps(item) + "\n" for item in POOL[:3]), encoding="utf-8")
    with pytest.raises(ProjectDataError) as caught:
        build_bundle(config, ["quality"], tmp_path / "bundle", holdout_fraction=0.0)
    assert str(caught.value) == ("bws_config.tuple_size is 4, more than the 3 items of the data: Potato 2.12 builds "
                                 "no tuples from them; add items or lower bws_config.tuple_size")


def test_texts_holding_any_string_json_can_carry_reach_the_tuples_as_they_are(tmp_path):
    config = _project(tmp_path)
    odd = ["lone \ud800 surrogate", "NUL \x00 and <b>&amp;</b>", "x" * 2_000_000]
    pool = [dict(item, text=odd[i]) if i < 3 else item for i, item in enumerate(POOL)]
    pool[0]["id"] = "id \x00 " + "y" * 1000  # a lone surrogate in an id is refused where items are read
    config.data_files[0].write_text("".join(json.dumps(item) + "\n" for item in pool), encoding="utf-8")
    build_bundle(config, ["quality"], tmp_path / "bundle", holdout_fraction=0.0)
    written = [json.loads(line) for line in (tmp_path / "bundle" / "items.jsonl").read_text("utf-8").splitlines()]
    expected = bws_tuples(pool, "id", "text", BwsConfig())
    assert [item["sides"]["quality"] for item in written] == [[m["text"] for m in t["_bws_items"]] for t in expected]
    assert any(odd[2] in item["sides"]["quality"] for item in written)
