"""Publishing runs' models to the Hugging Face Hub: the real huggingface_hub client against a stand-in Hub.

No Hub is reachable from these machines, so ``tests.support.hub.StandInHub``
serves the Hub's HTTP API on loopback (what it implements, and the client
version it was checked against — huggingface_hub 2.4.0 — are in its
docstring); every test here fails if the client calls an endpoint it does
not know. The runs are real: a tiny BERT trained by the real CLI and flow,
a full fine-tune (run 1), a LoRA adapter (run 2) and a decision-calibrate
run of run 1 (run 3). The models come back through the client's own
download (``snapshot_download``) and load with transformers and peft.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from potato.bundle.holdout import is_holdout
from potato.config import load_config
from potato.publish import publish_errors
from potato.runs.prefect_runs import project_key_of
from tests.support.hub import CHECKED_WITH, StandInHub, quiet_werkzeug
from tests.support.potato_project import DEFAULT_ANNOTATORS, item_text, make_project, true_label
from tests.support.runs import POTATO, noisy_tiny_project, potato, run_dir_of, store_of, tiny_project, wait_for
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.prefect, pytest.mark.training]

TOKEN = "hf_potatoTestAliceToken0123456789abcdef"      # alice, member of the organisation lab
BOB_TOKEN = "hf_potatoTestBobToken0123456789abcdefgh"   # bob: owns bob/*
N_ITEMS = 60
HOLDOUT = 0.35
BASE_ID = "potato-tests/tiny-bert"


@pytest.fixture(scope="module")
def hub():
    quiet_werkzeug()
    hub = StandInHub({TOKEN: ("alice", ("lab",)), BOB_TOKEN: ("bob", ())})
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(autouse=True)
def known_endpoints_only(hub):
    yield
    hub.check()


@pytest.fixture(scope="module")
def project(prefect_api, tmp_path_factory):
    """Runs 1 (full fine-tune), 2 (LoRA) and 3 (decision-calibrate of run 1) of a tiny project.

    Every third held-out item is labelled against its text: run 1 learns the (clean) training items, is sure
    of itself and wrong on those, so it is over-confident and run 3 has a calibration to keep and publish.
    """
    root = tmp_path_factory.mktemp("publish")
    held_out = [i for i in range(N_ITEMS) if is_holdout(f"r{i}", HOLDOUT)]
    config = noisy_tiny_project(root, N_ITEMS, HOLDOUT, DEFAULT_ANNOTATORS, wrong=lambda i: i in held_out[::3],
                                backends={"lab-workstation": {"type": "agent"}}, license="apache-2.0")
    for args in ((), ("--option", "lora=true"), ("--trainer", "decision-calibrate", "--option", "run=1")):
        done = potato("training", "run", str(config), *args)
        assert done.returncode == 0, done.stdout + done.stderr
    return config


def publish(config: Path, run_id: int, *args: str, endpoint: str, token: str | None = TOKEN,
            home: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """``potato training publish`` as a user runs it: the token from HF_TOKEN, or from the stored login in *home*."""
    environ = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME")}
    environ.update(HF_ENDPOINT=endpoint, HF_HOME=str(home or config.parent / "hf-home"), **env)
    if token is not None:
        environ["HF_TOKEN"] = token
    return subprocess.run([POTATO, "training", "publish", str(config), str(run_id), *args], capture_output=True,
                          text=True, timeout=120, env=environ, stdin=subprocess.DEVNULL)


def download(hub: StandInHub, repo: str, tmp_path: Path, token: str = TOKEN) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo, endpoint=hub.url, token=token, cache_dir=tmp_path / "hf-cache"))


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card[4:card.index("\n---\n", 4)])


def secrets_absent(text: str) -> list[str]:
    """The project's annotator names, item texts and item ids that *text* contains (whole words)."""
    found = [name for name in DEFAULT_ANNOTATORS if re.search(rf"\b{name}\b", text)]
    found += [t for t in (item_text(i, true_label(i)) for i in range(N_ITEMS)) if t in text]
    found += [f"r{i}" for i in range(N_ITEMS) if re.search(rf"\br{i}\b", text)]
    return found


def files_under(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_the_stand_in_names_the_client_it_was_checked_against():
    import huggingface_hub

    assert CHECKED_WITH == f"huggingface_hub {huggingface_hub.__version__}", \
        "huggingface_hub changed: check tests/support/hub.py against the new client and update CHECKED_WITH"


def test_a_full_fine_tune_is_published_from_the_stored_login_and_loads_with_its_labels(hub, project, tmp_path):
    from huggingface_hub import ModelCard
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    home = tmp_path / "hf-home"   # where `hf auth login` keeps the token
    home.mkdir()
    (home / "token").write_text(TOKEN)
    done = publish(project, 1, "--repo", "lab/review-sentiment", endpoint=hub.url, token=None, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    store = store_of(project)
    run = store.get_run(1)
    commit = run.publication["commit"]
    assert done.stdout.splitlines()[0] == (
        f"Publishing run 1 to lab/review-sentiment on {hub.url} (private if new, revision main)")
    assert done.stdout.splitlines()[-1] == (
        f"Published run 1 to {hub.url}/lab/review-sentiment as alice: commit {commit} (private)")
    assert done.stderr == ""

    # What arrived is what the run saved, byte for byte; large files went through LFS, the rest inline.
    artifacts = files_under(run_dir_of(project, 1) / "artifacts" / "sentiment")
    got = files_under(download(hub, "lab/review-sentiment", tmp_path))
    assert set(got) == set(artifacts) | {".gitattributes", "README.md"}
    for name, content in artifacts.items():
        if name not in ("README.md", "labels.json"):
            assert got[name] == content, name
    assert json.loads(got["labels.json"]) == {**json.loads(artifacts["labels.json"]), "base_model": None}
    assert hub.is_lfs("lab/review-sentiment", "model.safetensors")
    assert not hub.is_lfs("lab/review-sentiment", "config.json")
    assert hub.calls("PUT", "/lfs-upload/lab/review-sentiment/") == 1
    assert hub.repos["lab/review-sentiment"].private
    assert hub.message("lab/review-sentiment") == "Potato run 1: hf-text-classification on sentiment"

    snapshot = download(hub, "lab/review-sentiment", tmp_path)
    model = AutoModelForSequenceClassification.from_pretrained(snapshot)
    AutoTokenizer.from_pretrained(snapshot)
    assert model.config.id2label == {0: "positive", 1: "negative"}

    card = got["README.md"].decode()
    meta = front_matter(card)
    index = meta.pop("model-index")
    assert meta == {"library_name": "transformers", "pipeline_tag": "text-classification", "license": "apache-2.0",
                    "tags": ["potato", "hf-text-classification", "text-classification"]}
    data = json.loads((run_dir_of(project, 1) / "training-data.json").read_text())
    scores = run.scores["sentiment"]
    # The Hub's own parser reads the holdout scores as the model's evaluation results.
    results = ModelCard(card).data.eval_results
    assert index[0]["name"] == "review-sentiment"
    assert {(r.task_name, r.dataset_split, r.metric_type): r.metric_value for r in results}.items() >= {
        ("sentiment", "holdout", "accuracy"): scores["accuracy"], ("sentiment", "holdout", "macro_f1"): scores["macro_f1"]}.items()
    assert f"| sentiment | {scores['n']} | {scores['accuracy']:.3f} | {scores['macro_f1']:.3f} |" in card
    evaluation = json.loads((run_dir_of(project, 1) / "evaluation.json").read_text())["schemas"]["sentiment"]
    (pp, pn), (np_, nn) = evaluation["confusion"]
    assert f"| **positive** | {pp} | {pn} |\n| **negative** | {np_} | {nn} |" in card
    assert f"| items in the project | {N_ITEMS} |" in card and "| annotators | 3 |" in card
    labelled, held = data["labeled"]["sentiment"], data["holdout"]["sentiment"]
    assert f"| labelled items (sentiment) | {labelled}: {labelled - held} trained on, {held} held out |" in card
    per_label = data["labels"]["sentiment"]
    assert f"| labels per class (sentiment) | `positive` {per_label['positive']}, `negative` {per_label['negative']} |" in card
    assert "| aggregation of several annotators' labels | majority vote (a tie goes to the label listed first) |" in card
    assert "| held-out split | 35% of the labelled items, chosen by a hash of each item's id" in card
    assert "| backend type | local |\n| device | CPU (2 threads) |" in card
    assert "Potato run 1, finished " in card and "a full fine-tune of a local model directory (tiny-model)" in card
    assert 'from_pretrained("lab/review-sentiment")' in card
    assert "Potato run 3 recalibrated this model's confidences" in card
    # Counts only: no annotator, no item text, no id; and no path of this server in any file.
    assert secrets_absent(card) == []
    for name, content in got.items():
        text = content.decode("utf-8", "replace")
        assert str(project.parent) not in text and "/tmp/" not in text, name

    # The run record says where, which commit and who; the token is in no file of the project.
    assert run.publication["state"] == "published"
    assert run.publication["published"][-1] | {"at": 0} == {
        "repo": "lab/review-sentiment", "revision": "main", "commit": commit, "by": "alice", "via": "cli",
        "url": f"{hub.url}/lab/review-sentiment", "at": 0}
    assert token_files(project.parent) == []

    # Prefect's Artifacts page links the repository, on the flow run that trained the model.
    from prefect.artifacts import Artifact

    link = Artifact.get(f"potato-{project_key_of(load_config(project))}-hub-repo")
    assert link.data == f"[lab/review-sentiment on the Hugging Face Hub]({hub.url}/lab/review-sentiment)"
    assert str(link.flow_run_id) == run.prefect_flow_run_id
    assert link.description == f"Run 1 published to lab/review-sentiment (commit {commit[:12]})"


def token_files(directory: Path) -> list[str]:
    """Files under *directory* holding the token, found by grep: reading runs.db in this process would drop
    the POSIX locks of this process's SQLite connections to it (https://www.sqlite.org/howtocorrupt.html)."""
    found = subprocess.run(["grep", "-rlF", "--", TOKEN, str(directory)], capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    return found.stdout.split()


def test_a_lora_adapter_names_its_base_model_and_loads_with_peft_from_the_downloaded_files(hub, project, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    refused = publish(project, 2, "--repo", "lab/sentiment-lora", endpoint=hub.url)
    assert refused.returncode == 1
    base_dir = project.parent / "tiny-model"
    assert refused.stderr.strip() == str(publish_errors.BaseModelUnknown(2, str(base_dir))) == (
        f"Run 2 trained a LoRA adapter on the local model directory {base_dir}, which has no Hub id Potato knows, "
        f"and an adapter loads only on top of its base model. Fix: name the base model's Hub id (--base-model "
        f"owner/name on the command line, Base model on the run page, base_model in the API)")
    assert "lab/sentiment-lora" not in hub.repos  # refused before the Hub was asked anything

    done = publish(project, 2, "--repo", "lab/sentiment-lora", "--base-model", BASE_ID, "--public",
                   "--message", "LoRA of round 1", endpoint=hub.url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not hub.repos["lab/sentiment-lora"].private and hub.message("lab/sentiment-lora") == "LoRA of round 1"
    snapshot = download(hub, "lab/sentiment-lora", tmp_path)
    assert json.loads((snapshot / "adapter_config.json").read_text())["base_model_name_or_path"] == BASE_ID
    card = (snapshot / "README.md").read_text()
    assert front_matter(card)["library_name"] == "peft" and front_matter(card)["base_model"] == BASE_ID
    assert f'PeftModel.from_pretrained(base, "lab/sentiment-lora")' in card and secrets_absent(card) == []

    labels = ["positive", "negative"]

    def adapter(where: Path):
        base = AutoModelForSequenceClassification.from_pretrained(
            base_dir, num_labels=2, id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
        return PeftModel.from_pretrained(base, where).eval()

    ids = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        here = adapter(run_dir_of(project, 2) / "artifacts" / "sentiment")(input_ids=ids).logits
        there = adapter(snapshot)(input_ids=ids).logits
    assert torch.equal(here, there)


def test_a_decision_calibrate_run_publishes_its_calibration_with_the_model_it_calibrated(hub, project, tmp_path):
    done = publish(project, 3, "--repo", "lab/sentiment-calibrated", endpoint=hub.url)
    assert done.returncode == 0, done.stdout + done.stderr
    got = files_under(download(hub, "lab/sentiment-calibrated", tmp_path))
    assert got["calibration.json"] == (run_dir_of(project, 3) / "artifacts" / "calibration.json").read_bytes()
    assert got["model.safetensors"] == (run_dir_of(project, 1) / "artifacts/sentiment/model.safetensors").read_bytes()
    card = got["README.md"].decode()
    scores = store_of(project).get_run(3).scores["sentiment"]
    assert "Potato run 3 (`decision-calibrate`) recalibrated the confidences" in card
    assert f"| sentiment | {scores['method']} | {'kept' if scores['kept'] else 'backed out'} |" in card


def test_refusals_say_why_and_how_to_fix_it(hub, project, tmp_path):
    store = store_of(project)
    failed = store.create_run("hf-text-classification", ["sentiment"], "local")
    store.transition(failed.id, "failed", from_states=("queued",), error="boom")
    agent = store.create_run("hf-text-classification", ["sentiment"], "lab-workstation")
    store.transition(agent.id, "running", from_states=("queued",))
    uri = "ws1.lab.example.org:/home/me/.cache/potato-training/jobs/3/artifacts"
    store.transition(agent.id, "succeeded", from_states=("running",), artifact_uri=uri)
    run_dir_of(project, agent.id).mkdir(parents=True)
    local = run_dir_of(project, agent.id) / "artifacts"
    hub.make_repo("bob/sentiment", "bob")  # someone else's repo

    cases = [
        ((failed.id, "--repo", "lab/x"), {}, f"Run {failed.id} failed, so it has no model to publish: only a run that "
         "succeeded has one. Fix: start a new run and publish that one once it has succeeded"),
        ((agent.id, "--repo", "lab/x"), {}, f"Run {agent.id} trained on the agent backend lab-workstation, whose model "
         f"stays on the agent's machine ({uri}), and publishing needs the model files on this server. Fix: copy it "
         f"here (`scp -r ws1.lab.example.org:/home/me/.cache/potato-training/jobs/3/artifacts {local.parent}/`) and "
         f"publish again, or publish from ws1.lab.example.org (`hf upload <owner/name> "
         f"/home/me/.cache/potato-training/jobs/3/artifacts`)"),
        ((1, "--repo", "sentiment"), {}, "'sentiment' is not a Hugging Face Hub repo name: give owner/name, the owner "
         "being your user or an organization (letters, digits, '-', '_' and '.'), e.g. my-lab/review-sentiment"),
        ((1, "--repo", "lab/x"), {"token": None}, "No Hugging Face token: publishing needs one with write access. "
         "Fix: run `hf auth login` as the account that runs Potato, or set HF_TOKEN in the environment of `potato "
         "start` (and of `potato training publish`); then publish again"),
        ((1, "--repo", "lab/x"), {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set, so huggingface_hub reaches no Hub. "
         "Fix: unset it for `potato start` (or for `potato training publish`) to publish"),
        ((1, "--repo", "lab/x"), {"token": "hf_notAToken"}, f"{hub.url} refused the Hugging Face token (401 "
         f"Unauthorized): it is wrong, expired or revoked. Fix: make a token with write access at "
         f"{hub.url}/settings/tokens and set HF_TOKEN to it for `potato start` and `potato training publish`; then "
         f"publish again"),
        ((1, "--repo", "bob/sentiment"), {}, f"{hub.url} does not let alice write to bob/sentiment (403 Forbidden): "
         f"the repo or its owner bob is someone else's, or the token may only read. Fix: publish to a repo of your "
         f"own (e.g. alice/sentiment) or of an organization you can write to, or use a token with write access to bob"),
    ]
    for args, env, message in cases:
        done = publish(project, *map(str, args), endpoint=hub.url, home=tmp_path / "empty-home", **env)
        assert (done.returncode, done.stderr.strip()) == (1, message), args
    assert hub.paths("bob/sentiment") == [".gitattributes"] and "lab/x" not in hub.repos
    assert str(publish_errors.ModelOnAgent(agent.id, "lab-workstation", uri, str(local))) == cases[1][2]


def test_a_cut_connection_commits_nothing_and_publishing_again_sends_only_what_is_missing(hub, project):
    store = store_of(project)
    before = {p: hashlib.sha256(c).hexdigest() for p, c in files_under(run_dir_of(project, 1)).items()}
    state, earlier = store.get_run(1).state, store.get_run(1).publication.get("published", [])
    with TcpProxy(int(hub.url.rsplit(":", 1)[1])) as proxy:
        endpoint = f"http://127.0.0.1:{proxy.port}"
        proxy.cut_after(200, direction="up", when=lambda first: first.startswith(b"POST /api/models/lab/cut/commit/"))
        done = publish(project, 1, "--repo", "lab/cut", endpoint=endpoint)
        assert done.returncode == 1
        message = done.stderr.strip()
        assert message.startswith(f"The upload to {endpoint} failed: ")
        assert message.endswith(
            f". Run 1 and its files are as they were, and the Hub takes a commit whole or not at all: lab/cut has all "
            f"of this publish or none of it. Fix: check that this server reaches {endpoint} (HF_ENDPOINT names the "
            f"Hub), then publish again; what already reached the Hub is not sent twice")
        assert hub.paths("lab/cut") == [".gitattributes"]  # no commit
        run = store.get_run(1)
        assert (run.state, run.publication["state"], run.publication["error"]) == (state, "failed", message)
        assert run.publication.get("published", []) == earlier  # earlier publishes stay known
        uploads = hub.calls("PUT", "/lfs-upload/lab/cut/")
        assert uploads == 1

        again = publish(project, 1, "--repo", "lab/cut", endpoint=endpoint)
        assert again.returncode == 0, again.stdout + again.stderr
    assert hub.calls("PUT", "/lfs-upload/lab/cut/") == uploads  # the model's bytes were not sent twice
    assert "model.safetensors" in hub.paths("lab/cut")
    assert {p: hashlib.sha256(c).hexdigest() for p, c in files_under(run_dir_of(project, 1)).items()} == before
    assert store.get_run(1).publication["state"] == "published"


def test_the_admin_api_publishes_in_the_background_and_streams_the_download(hub, project, monkeypatch, caplog):
    from potato.server import create_app

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    app = create_app(load_config(project), start_background=False)
    client = app.test_client()
    key = {"X-API-Key": "test-admin-key"}
    base = "/admin/training/api/runs/1"

    assert client.post(f"{base}/publish", json={"repo": "lab/api"}).status_code == 401
    assert client.get(f"{base}/model.tar.gz").status_code == 401
    status = client.get(f"{base}/publish", headers=key).get_json()
    assert (status["run_state"], status["ready"], status["refusal"], status["kind"], status["hub"]) == (
        "succeeded", True, None, "full", hub.url)
    bad = client.post(f"{base}/publish", headers=key, json={"repo": "lab/api", "private": "yes"})
    assert (bad.status_code, bad.get_json()["error"]) == (400, "private must be true (the default) or false")

    answer = client.post(f"{base}/publish", headers=key, json={"repo": "lab/api"})
    assert answer.status_code == 202, answer.get_json()
    assert answer.get_json()["publication"]["repo"] == "lab/api"
    published = wait_for(lambda: (p := client.get(f"{base}/publish", headers=key).get_json()["publication"])
                         ["state"] != "uploading" and p, 60, "the upload to end")
    assert published["state"] == "published", published
    assert published["bytes"] == published["total"] > 0
    assert published["latest"]["repo"] == "lab/api" and published["latest"]["via"] == "api"
    listed = client.get("/admin/training/api/runs", headers=key).get_json()["runs"]
    assert [r["publication"]["latest"]["repo"] for r in listed if r["id"] == 1] == ["lab/api"]

    download_ = client.get(f"{base}/model.tar.gz", headers=key)
    assert download_.status_code == 200 and download_.is_streamed
    assert download_.headers["Content-Disposition"] == 'attachment; filename="potato-run-1-model.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(download_.get_data()), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    model = run_dir_of(project, 1) / "artifacts" / "sentiment" / "model.safetensors"
    assert members["potato-run-1-model/model.safetensors"] == model.read_bytes()
    assert "potato-run-1-model/README.md" in members
    assert TOKEN not in caplog.text and token_files(project.parent) == []


def _host_environments(sshd_service) -> list[bytes]:
    """The environments of this session's processes on the ssh host (the potatotest user's, tagged)."""
    import pwd

    uid = pwd.getpwnam(sshd_service.user).pw_uid
    tag = f"\0POTATO_TEST_SERVICES={sshd_service.tag}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    environ = b"\0" + fh.read()
                if tag in environ:
                    found.append(environ)
        except OSError:
            continue
    return found


@pytest.mark.sshd
def test_a_model_left_on_the_ssh_host_is_refused_naming_the_host_and_the_path(
        hub, prefect_api, sshd_service, ssh_user_config, shared_model, tmp_path, monkeypatch):
    from potato.runs import artifact_uri
    from tests.integration.test_ssh_backend import ssh_project
    from tests.support.runs import potato_watching

    config = ssh_project(tmp_path, shared_model, ssh_user_config, python=sshd_service.python, fetch_artifacts=False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the server's token: it must not reach the GPU host
    environments: list[bytes] = []
    done = potato_watching(lambda: environments.extend(_host_environments(sshd_service)),
                           "training", "run", str(config), interval=0.05)
    assert done.returncode == 0, done.stdout + done.stderr
    assert environments and not [e for e in environments if TOKEN.encode() in e]

    run = store_of(config).get_run(1)
    place = artifact_uri.parse(run.artifact_uri)
    assert (place.host, place.all_on_host) == (ssh_user_config, True)
    remote = Path(place.remote_dir)
    try:
        assert (remote / "sentiment" / "config.json").is_file()  # the model is there, on the "host"
        refused = publish(config, 1, "--repo", "lab/ssh", endpoint=hub.url)
        local = run_dir_of(config, 1) / "artifacts"
        assert (refused.returncode, refused.stderr.strip()) == (1, str(publish_errors.ModelOnHost(
            1, "gpu-server", ssh_user_config, str(remote), str(local), partly=False)))
        assert refused.stderr.startswith(f"Run 1's model stayed on {ssh_user_config} in {remote} (fetch_artifacts is "
                                         f"false for gpu-server), and publishing needs the model files on this server.")
        assert "lab/ssh" not in hub.repos
    finally:
        import shutil

        shutil.rmtree(remote.parent, ignore_errors=True)  # the job directory fetch_artifacts: false kept


# -- an LLM's adapter, a merged LLM, a sklearn-text model: publishable, each with the card that loads it ------


LLM_BASE_ID = "potato-tests/tiny-llama"


def _model_run(config_path: Path, trainer: str, model_dir_of) -> int:
    """A succeeded run of *trainer* whose model files *model_dir_of(directory)* puts in place; its id."""
    from potato.config import load_config
    from potato.runs.paths import open_store, run_paths

    config = load_config(config_path)
    store = open_store(config)
    run = store.create_run(trainer, ["sentiment"], "local", options={"model": "/srv/models/tiny-llama"}
                           if trainer == "hf-llm-finetune" else {})
    store.update_run(run.id, state="succeeded", started_at=1.0, finished_at=2.0)
    directory = run_paths(config, run.id).dir / "artifacts" / "sentiment"
    model_dir_of(directory)
    store.close()
    return run.id


def _published_card(hub: StandInHub, config: Path, run_id: int, repo: str, *args: str) -> tuple[str, dict]:
    """Publish run *run_id* to *repo* with the CLI; the card the Hub holds, and its metadata as
    huggingface_hub's ModelCard reads it."""
    from huggingface_hub import ModelCard

    done = publish(config, run_id, "--repo", repo, *args, endpoint=hub.url)
    assert done.returncode == 0, done.stdout + done.stderr
    card = hub.read(repo, "README.md").decode()
    return card, ModelCard(card).data.to_dict()


def _card_code(card: str) -> str:
    return card.split("```python\n", 1)[1].split("\n```", 1)[0]


def _run_card_code(hub: StandInHub, card: str, tmp_path: Path, check: str) -> str:
    """Run the card's own loading code (then *check*) as its reader would, against the stand-in Hub."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HOME=str(tmp_path / "reader-hf-home"))
    done = subprocess.run([sys.executable, "-c", _card_code(card) + "\n" + check], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def tiny_llm(hub, tmp_path_factory):
    """A tiny causal LM, also on the stand-in Hub as LLM_BASE_ID (an adapter loads its base from there)."""
    from tests.support.tiny_llm import build_tiny_causal_lm

    base = build_tiny_causal_lm(tmp_path_factory.mktemp("tiny-llm") / "base", [item_text(i, true_label(i))
                                                                                for i in range(20)])
    hub.make_repo(LLM_BASE_ID, "potato-tests", files={p.name: p.read_bytes() for p in base.iterdir() if p.is_file()})
    return base


def _llm_labels(kind: str, base: Path, labels) -> dict:
    """labels.json as hf-llm-finetune writes it (potato/training/trainers/hf_llm_finetune.py, ``_save``)."""
    return {"trainer": "hf-llm-finetune", "schema": "sentiment", "answer_kind": "nominal" if labels else "text",
            "labels": labels, "kind": kind, "base_model": str(base), "load_in_4bit": False, "max_length": 256,
            "max_new_tokens": 32, "prompt_template": "Review: {text}\nSentiment:", "description": None,
            "chat_template": True}


def test_an_llm_adapter_publishes_with_a_card_that_loads_it_on_its_base_model(hub, tiny_llm, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def adapter(directory: Path) -> None:
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llm), LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        for peft_config in model.peft_config.values():
            peft_config.base_model_name_or_path = str(tiny_llm)
        model.save_pretrained(directory)
        AutoTokenizer.from_pretrained(tiny_llm).save_pretrained(directory)
        # A text schema's adapter: its labels.json has no labels (once refused as "missing labels.json").
        (directory / "labels.json").write_text(json.dumps(_llm_labels("lora", tiny_llm, None)))

    config = make_project(tmp_path, n_items=10)
    run_id = _model_run(config, "hf-llm-finetune", adapter)
    refused = publish(config, run_id, "--repo", "lab/llm-adapter", endpoint=hub.url)
    assert (refused.returncode, refused.stderr.strip()) == (1, str(publish_errors.BaseModelUnknown(run_id, str(tiny_llm))))
    card, meta = _published_card(hub, config, run_id, "lab/llm-adapter", "--base-model", LLM_BASE_ID)
    assert (meta["library_name"], meta["base_model"], meta["pipeline_tag"]) == ("peft", LLM_BASE_ID,
                                                                                "text-generation")
    assert "AutoPeftModelForCausalLM.from_pretrained(\"lab/llm-adapter\")" in card
    assert "AutoModelForSequenceClassification" not in card and str(tiny_llm) not in card
    adapter_config = json.loads(hub.read("lab/llm-adapter", "adapter_config.json"))
    assert adapter_config["base_model_name_or_path"] == LLM_BASE_ID
    out = _run_card_code(hub, card, tmp_path,
                         "print(type(model).__name__, model.peft_config['default'].base_model_name_or_path)")
    assert out.split() == ["PeftModelForCausalLM", LLM_BASE_ID]


def test_a_merged_llm_publishes_with_a_card_that_loads_it_as_a_causal_lm(hub, tiny_llm, tmp_path):
    def merged(directory: Path) -> None:
        directory.mkdir(parents=True)
        for p in tiny_llm.iterdir():
            (directory / p.name).write_bytes(p.read_bytes())
        (directory / "labels.json").write_text(json.dumps(_llm_labels("merged", tiny_llm, ["positive", "negative"])))

    config = make_project(tmp_path, n_items=10)
    run_id = _model_run(config, "hf-llm-finetune", merged)
    card, meta = _published_card(hub, config, run_id, "lab/llm-merged", "--base-model", LLM_BASE_ID)
    assert (meta["library_name"], meta["base_model"], meta["pipeline_tag"]) == ("transformers", LLM_BASE_ID,
                                                                                "text-generation")
    out = _run_card_code(hub, card, tmp_path, "print(type(model).__name__)")
    assert out.strip() == "LlamaForCausalLM"


def test_a_sklearn_text_model_publishes_with_a_card_that_loads_its_pickle(hub, tmp_path):
    import pickle

    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    def sklearn_model(directory: Path) -> None:
        directory.mkdir(parents=True)
        texts = [item_text(i, true_label(i)) for i in range(20)]
        pipeline = Pipeline([("vectorizer", TfidfVectorizer()), ("classifier", LogisticRegression())])
        pipeline.fit(texts, [true_label(i) == "negative" for i in range(20)])
        (directory / "model.pkl").write_bytes(pickle.dumps(pipeline))
        (directory / "labels.json").write_text(json.dumps({  # as sklearn-text writes it: no "kind"
            "trainer": "sklearn-text", "schema": "sentiment", "labels": ["positive", "negative"],
            "answers": {"kind": "nominal"}, "classifier": "sklearn.linear_model.LogisticRegression",
            "vectorizer": "sklearn.feature_extraction.text.TfidfVectorizer",
            "calibration": None}))

    config = make_project(tmp_path, n_items=10)
    run_id = _model_run(config, "sklearn-text", sklearn_model)
    card, meta = _published_card(hub, config, run_id, "lab/sklearn")
    assert (meta["library_name"], meta["pipeline_tag"]) == ("sklearn", "text-classification")
    assert "base_model" not in meta and "sentence-transformers/all-MiniLM-L6-v2" not in card
    out = _run_card_code(hub, card, tmp_path, "print(labels, probabilities.shape)")
    assert out.strip() == "['positive', 'negative'] (1, 2)"
