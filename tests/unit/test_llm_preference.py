"""hf-llm-finetune's ``objective`` (sft or dpo) and ``beta``: what is refused before a run is queued, and DPO's
own arithmetic, without a model."""

from __future__ import annotations

import math

from click.testing import CliRunner

from potato.cli import main
from potato.config import load_config
from potato.runs.paths import open_store
from potato.training.trainers import hf_llm_finetune as llm
from potato.training.trainers.llm_preference import Pairs, chosen_sign, rewards
from tests.support.potato_project import make_project
from tests.unit.test_server_support import BACKENDS

SFT_ON_A_COMPARISON = (
    "Schema 'pref' is a pairwise comparison: hf-llm-finetune learns it with objective dpo (set "
    "model_training.trainers.hf-llm-finetune.objective: dpo, or --option objective=dpo for one run), or "
    "hf-reward-model trains a reward model on it")


def test_the_objective_and_beta_are_checked_with_the_other_options():
    assert llm.DEFAULT_OPTIONS["objective"] == "sft" and llm.DEFAULT_OPTIONS["beta"] == 0.1
    assert llm.check_options({"objective": "dpo", "beta": 0.5}) == []
    assert llm.check_options({"objective": "ppo", "beta": 0}) == [
        "objective must be sft (learn the annotators' answers) or dpo (learn which of two responses they "
        "preferred), got 'ppo'",
        "beta must be a number above 0 (DPO's usual: 0.1), got 0"]
    assert llm.check_options({"beta": True}) == ["beta must be a number above 0 (DPO's usual: 0.1), got True"]
    assert llm.check_options({"beta": math.inf})[0].startswith("beta must be a number above 0")


def test_each_objective_trains_its_own_kinds_and_says_which_to_set():
    assert llm.check_run_schemas({}, [("sentiment", "nominal"), ("summary", "text")]) == []
    assert llm.check_run_schemas({"objective": "dpo"}, [("pref", "comparison")]) == []
    assert llm.check_run_schemas({}, [("pref", "comparison")]) == [SFT_ON_A_COMPARISON]
    assert llm.check_run_schemas({"objective": "dpo"}, [("pref", "comparison"), ("sentiment", "nominal")]) == [
        "objective dpo learns pairwise comparisons only, and schema 'sentiment' is nominal: train it in a run of "
        "its own with objective sft (--schema picks a run's schemas)"]


def test_a_dpo_run_on_a_label_schema_is_refused_before_it_is_queued(tmp_path):
    config = make_project(tmp_path, n_items=6, model_training={"enabled": True, "backends": BACKENDS})
    refused = CliRunner().invoke(main, ["training", "run", str(config), "--trainer", "hf-llm-finetune", "--option",
                                        "model=/models/qwen", "--option", "objective=dpo", "--detach"])
    assert (refused.exit_code, refused.output.splitlines()[-1]) == (
        1, "Error: hf-llm-finetune: objective dpo learns pairwise comparisons only, and schema 'sentiment' is "
           "nominal: train it in a run of its own with objective sft (--schema picks a run's schemas)")
    assert open_store(load_config(config)).count_runs() == 0


def test_the_chosen_side_and_the_implicit_rewards():
    assert [chosen_sign(c) for c in ({"A": 2, "B": 1, "tie": 0}, {"A": 0, "B": 3, "tie": 0},
                                     {"A": 1, "B": 1, "tie": 1})] == [-1, 1, 0]
    # beta * (log π - log π_ref) for each side: the tuned model moved B up by 2 nats and A down by 1
    assert rewards((-11.0, -8.0), (-10.0, -10.0), 0.1) == (-0.1 * 1, 0.1 * 2)


class _Format:
    """The two calls Pairs makes of a PromptFormat: one id per character, and an end of one id."""
    end = [0]

    def encode(self, text):
        return [ord(c) for c in text]

    def fit_prompt(self, template, text, labels, description, room):
        ids = self.encode(template.replace("{text}", text))
        return ids[:room], len(ids) > room


class _Items:
    def __init__(self, records):
        self.records = records

    def record(self, position):
        return self.records[position]


class _Schema:
    schema, description = "pref", "Which reply is better?"


def test_a_pair_keeps_both_responses_within_max_length_and_counts_what_it_cut():
    items = _Items([{"text": "ab", "sides": {"pref": ["xy", "z"]}}, {"text": "p" * 30, "sides": {"pref": ["r" * 20, "s"]}},
                    {"text": "no pair", "sides": {"pref": ["only one"]}}, {"text": "none"}])
    pairs = Pairs(_Format(), "{text}", _Schema(), items, max_length=16)
    assert pairs.tokens(0) == ([97, 98], [120, 121, 0], [122, 0]) and pairs.cut == 0
    prompt, a, b = pairs.tokens(1)
    assert (len(a), len(b), len(prompt)) == (8, 2, 8) and pairs.cut == 1  # each response at most half of 16
    assert pairs.length(1) == 16
    assert (pairs.has(2), pairs.has(3)) == (False, False)


def test_a_run_that_names_no_schema_takes_those_its_objective_trains(tmp_path):
    import yaml

    config = make_project(tmp_path, n_items=6, model_training={"enabled": True, "backends": BACKENDS})
    raw = yaml.safe_load(config.read_text())
    raw["annotation_schemes"].append({"annotation_type": "pairwise", "name": "pref", "mode": "binary",
                                      "items_key": "responses", "description": "Which reply is better?"})
    config.write_text(yaml.safe_dump(raw))
    run = ["training", "run", str(config), "--trainer", "hf-llm-finetune", "--option", "model=/models/qwen"]
    sft = CliRunner().invoke(main, [*run, "--detach"])
    assert sft.exit_code == 0 and "Run 1 queued: hf-llm-finetune on sentiment" in sft.output, sft.output
    dpo = CliRunner().invoke(main, [*run, "--option", "objective=dpo", "--detach"])
    assert dpo.exit_code == 0 and "Run 2 queued: hf-llm-finetune on pref" in dpo.output, dpo.output
    named = CliRunner().invoke(main, [*run, "--schema", "pref", "--detach"])
    assert (named.exit_code, named.output.splitlines()[-1]) == (1, f"Error: hf-llm-finetune: {SFT_ON_A_COMPARISON}")


def test_the_holdout_line_says_what_the_base_model_preferred_after_dpo():
    from potato.training.trainers.metrics import describe

    reward = {"kind": "comparison", "n": 30, "agreement": 0.9667, "annotator_agreement": 0.8778, "decided": 30}
    assert describe("pref", reward) == (
        "Holdout pref: agreement with the majority 0.967, with each annotator 0.878 (n=30)")
    assert describe("pref", dict(reward, agreement_before=0.5167)) == (
        "Holdout pref: agreement with the majority 0.967, with each annotator 0.878 (the base model: 0.517) (n=30)")
