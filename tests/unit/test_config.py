"""potato.config: the key tables, load_config's typed result, SLURM times, docs/backends.md."""

from __future__ import annotations

import copy
import sys
import types
from pathlib import Path

import pytest
import yaml

from potato import config as config_mod
from potato.backend_types.type_registry import BACKEND_TYPES, backend_type
from potato.config import (
    DOCS_COMMAND,
    Issue,
    build_config,
    load_config,
    parse_slurm_time,
    render_backends_doc,
)
from potato.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# The user guide's full example config, verbatim.
SEED_CONFIG = """\
annotation_task_name: "Review Sentiment"
task_dir: "."
data_files:
  - "data/reviews.json"
item_properties:
  id_key: "id"
  text_key: "text"
output_annotation_dir: "annotation_output"
admin_api_key: "test-admin-key"

annotation_schemes:
  - annotation_type: "radio"
    name: "sentiment"
    description: "Is this review positive or negative?"
    labels: ["positive", "negative"]

model_training:
  enabled: true
  backend: gpu-server        # the default for runs; leave out to keep runs local
  max_wall_seconds: 3600
  writeback:
    schemas: ["sentiment"]
    include_unlabeled: true
    min_confidence: 0.6
  backends:
    gpu-server:
      type: ssh
      host: gpu.example.org
      python: /opt/conda/bin/python3
      gpus: auto
      min_free_gpu_mb: 4000
    cluster:
      type: slurm
      host: login.cluster.example.org
      python: /opt/conda/bin/python3
      job_python: /shared/envs/train/bin/python
      remote_dir: /shared/projects/me/potato-training
      gres: gpu:1
      time: "04:00:00"
      prelude: ["module load cuda/12.4"]
    lab-workstation:
      type: agent
      queue_timeout_s: 3600
"""


def seed_dict() -> dict:
    return yaml.safe_load(SEED_CONFIG)


def write_project(tmp_path: Path, config: str | dict = SEED_CONFIG) -> Path:
    """Write *config* (YAML text or a dict) as tmp_path/config.yaml, with the seeds' data file."""
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "reviews.json").write_text('{"id": "r1", "text": "Great!"}\n')
    path = tmp_path / "config.yaml"
    text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
    path.write_text(text)
    return path


def build(tmp_path: Path, raw: dict):
    path = write_project(tmp_path, raw)
    return build_config(copy.deepcopy(raw), path)


# --- load_config on the seeds' example --------------------------------------


def test_seed_config_loads_typed(tmp_path):
    cfg = load_config(write_project(tmp_path))
    assert cfg.path == tmp_path / "config.yaml"
    assert cfg.task_dir == tmp_path.resolve()
    assert cfg.data_files == (tmp_path.resolve() / "data" / "reviews.json",)
    assert cfg.output_annotation_dir == tmp_path.resolve() / "annotation_output"
    assert cfg.training_dir == tmp_path.resolve() / "annotation_output" / "training"
    assert (cfg.id_key, cfg.text_key, cfg.admin_api_key) == ("id", "text", "test-admin-key")
    assert cfg.annotation_task_name == "Review Sentiment"
    assert cfg.schemes[0].name == "sentiment" and cfg.schemes[0].labels == ("positive", "negative")
    assert cfg.scheme("sentiment").annotation_type == "radio"
    assert cfg.warnings == ()

    mt = cfg.model_training
    assert mt.enabled is True and mt.backend == "gpu-server" and mt.max_wall_seconds == 3600
    assert (mt.grace_seconds, mt.heartbeat_timeout_s, mt.device) == (20, 120, "auto")
    assert (mt.max_predictions_mb, mt.holdout_fraction) == (512, 0.2)
    assert mt.writeback.schemas == ("sentiment",)
    assert mt.writeback.include_unlabeled is True and mt.writeback.min_confidence == 0.6
    assert mt.auto_retrain.enabled is False and mt.auto_retrain.backend is None
    assert list(mt.backends) == ["local", "gpu-server", "cluster", "lab-workstation"]


def test_seed_backends_have_every_key_with_defaults(tmp_path):
    backends = load_config(write_project(tmp_path)).model_training.backends
    ssh, slurm, agent, local = (backends[n] for n in ("gpu-server", "cluster", "lab-workstation", "local"))
    assert [b.describe() for b in backends.values()] == [
        "local (this machine)",
        "gpu-server (ssh to gpu.example.org)",
        "cluster (slurm on login.cluster.example.org)",
        "lab-workstation (agent)",
    ]
    assert set(ssh.options) == set(backend_type("ssh").defaults())
    assert ssh.host == "gpu.example.org" and ssh.get("python") == "/opt/conda/bin/python3"
    assert ssh.get("remote_dir") == "~/.cache/potato-training"
    assert (ssh.get("gpus"), ssh.get("min_free_gpu_mb"), ssh.get("max_artifact_mb")) == ("auto", 4000, 2048)
    assert ssh.get("fetch_artifacts") is True and ssh.get("keep_remote") is False
    assert ssh.get("heartbeat_timeout_s") == 120 and ssh.get("packages") == ()
    assert slurm.get("time") == "04:00:00" and slurm.get("prelude") == ("module load cuda/12.4",)
    assert slurm.get("job_python") == "/shared/envs/train/bin/python" and slurm.get("gres") == "gpu:1"
    assert agent.options == {"description": None, "heartbeat_timeout_s": 120, "queue_timeout_s": 3600}
    assert local.type == "local" and local.get("device") == "auto"


def test_tables_hold_exactly_the_spec_keys():
    # The user guide's keys per backend type, column by column, plus copy_stall_timeout_s: the copy's
    # "sent nothing for 180 s" as a setting (a slow link may need more); and for several
    # GPUs: max_gpus widens `gpus: auto`, processes asks for data-parallel processes (ssh, local).
    common_ssh_slurm = {"type", "description", "host", "user", "port", "identity_file", "python",
                        "remote_dir", "env", "num_threads", "max_artifact_mb", "fetch_artifacts",
                        "keep_remote", "heartbeat_timeout_s", "copy_stall_timeout_s"}
    assert {k.name for k in backend_type("ssh").keys} == common_ssh_slurm | {
        "gpus", "min_free_gpu_mb", "packages", "max_gpus", "processes"}
    assert {k.name for k in backend_type("slurm").keys} == common_ssh_slurm | {
        "job_python", "prelude", "partition", "account", "qos", "gres", "time", "mem",
        "cpus_per_task", "constraint", "poll_interval_s"}
    assert {k.name for k in backend_type("agent").keys} == {"type", "description", "heartbeat_timeout_s",
                                                       "queue_timeout_s"}
    required = {t.name: {k.name for k in t.keys if k.required} for t in BACKEND_TYPES.values()}
    assert required == {"ssh": {"type", "host"}, "slurm": {"type", "host", "remote_dir", "job_python"},
                        "agent": {"type"}, "local": set()}


def test_paths_resolve_from_config_dir_then_task_dir(tmp_path):
    project = tmp_path / "project"
    (project / "items").mkdir(parents=True)
    (project / "items" / "a.jsonl").write_text("{}\n")
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "config.yaml"
    path.write_text("task_dir: ../project\ndata_files: [items/a.jsonl]\noutput_annotation_dir: out\n")
    cfg = load_config(path)
    assert cfg.task_dir == project.resolve()
    assert cfg.data_files == (project.resolve() / "items" / "a.jsonl",)
    assert cfg.output_annotation_dir == project.resolve() / "out"
    assert cfg.model_training.backend == "local" and list(cfg.model_training.backends) == ["local"]


def test_labels_may_be_strings_or_mappings_and_other_keys_are_ignored(tmp_path):
    raw = seed_dict()
    raw["annotation_schemes"].append(
        {"annotation_type": "multiselect", "name": "topics",
         "labels": [{"name": "food", "tooltip": "about food"}, "service"]})
    raw["server_name"] = "ignored"
    raw["login"] = {"type": "password"}
    cfg = load_config(write_project(tmp_path, raw))
    assert cfg.scheme("topics").labels == ("food", "service")
    assert cfg.raw["server_name"] == "ignored"


def test_unquoted_base60_time_stays_a_string(tmp_path):
    # PyYAML's YAML 1.1 would read 12:00:00 as the int 43200 (minutes, to SLURM).
    text = SEED_CONFIG.replace('time: "04:00:00"', "time: 12:00:00")
    cfg = load_config(write_project(tmp_path, text))
    assert cfg.model_training.backends["cluster"].get("time") == "12:00:00"
    assert cfg.warnings == (Issue(
        "model_training.backends.cluster.time",
        "model_training.backends.cluster.time is 12:00:00. A job that holds a GPU for more than "
        "6 hours is long on a shared cluster; check its policy"),)


def test_heartbeat_and_local_settings_come_from_model_training(tmp_path):
    raw = seed_dict()
    mt = raw["model_training"]
    mt.update(heartbeat_timeout_s=60, device="cpu", num_threads=4, max_ram_mb=8000)
    mt["backends"]["cluster"]["heartbeat_timeout_s"] = 300
    backends = load_config(write_project(tmp_path, raw)).model_training.backends
    assert backends["gpu-server"].get("heartbeat_timeout_s") == 60
    assert backends["cluster"].get("heartbeat_timeout_s") == 300
    assert backends["local"].options == {"description": None, "device": "cpu", "num_threads": 4,
                                         "max_ram_mb": 8000, "processes": 1}


def test_a_local_entry_may_override_local_settings(tmp_path):
    raw = seed_dict()
    raw["model_training"]["backends"]["local"] = {"device": "cuda:1"}
    backends = load_config(write_project(tmp_path, raw)).model_training.backends
    assert list(backends)[0] == "local" and backends["local"].get("device") == "cuda:1"


def test_gpus_as_yaml_int_means_that_gpu(tmp_path):
    raw = seed_dict()
    raw["model_training"]["backends"]["gpu-server"]["gpus"] = 1
    cfg = load_config(write_project(tmp_path, raw))
    assert cfg.model_training.backends["gpu-server"].get("gpus") == "1"


def test_null_value_takes_the_default(tmp_path):
    raw = seed_dict()
    raw["model_training"]["backends"]["gpu-server"]["min_free_gpu_mb"] = None
    cfg = load_config(write_project(tmp_path, raw))
    assert cfg.model_training.backends["gpu-server"].get("min_free_gpu_mb") == 2000


def test_load_config_lists_every_error(tmp_path):
    raw = seed_dict()
    raw["model_training"]["backends"]["gpu-server"]["pyhton"] = "x"
    raw["model_training"]["backends"]["cluster"]["remote_dir"] = "/tmp/jobs"
    path = write_project(tmp_path, raw)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert text.splitlines()[0] == f"{path} has 2 errors:"
    assert "  - model_training.backends.gpu-server.pyhton is not a key of an ssh backend" in text
    assert "  - model_training.backends.cluster.remote_dir is '/tmp/jobs'" in text
    assert [i.path for i in info.value.issues] == ["model_training.backends.gpu-server.pyhton",
                                                   "model_training.backends.cluster.remote_dir"]


def test_load_config_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; check the path"):
        load_config(tmp_path / "nope.yaml")


# --- trainers ----------------------------------------------------------------


def test_trainer_options_checked_by_the_trainer_module(tmp_path, monkeypatch):
    from potato.training.trainers import registry
    from potato.training.trainers.registry import TrainerInfo

    module = types.ModuleType("fake_trainer_for_tests")
    module.check_options = lambda options: [f"epochs is {options['epochs']!r}; use a whole number"]
    monkeypatch.setitem(sys.modules, "fake_trainer_for_tests", module)
    monkeypatch.setitem(registry.TRAINERS, "fake", TrainerInfo("fake", "fake_trainer_for_tests", ("nominal",)))
    raw = seed_dict()
    raw["model_training"]["trainers"] = {"fake": {"epochs": "two"}}
    result = build(tmp_path, raw)
    assert result.errors == (Issue("model_training.trainers.fake",
                                   "model_training.trainers.fake: epochs is 'two'; use a whole number"),)


def test_trainer_module_missing_or_without_check_is_tolerated(tmp_path, monkeypatch):
    from potato.training.trainers import registry
    from potato.training.trainers.registry import TrainerInfo

    monkeypatch.setitem(registry.TRAINERS, "absent", TrainerInfo("absent", "no_such_module_for_tests", ("nominal",)))
    monkeypatch.setitem(sys.modules, "bare_trainer_for_tests", types.ModuleType("bare_trainer_for_tests"))
    monkeypatch.setitem(registry.TRAINERS, "bare", TrainerInfo("bare", "bare_trainer_for_tests", ("nominal",)))
    raw = seed_dict()
    raw["model_training"]["trainers"] = {"absent": {"epochs": 2}, "bare": {}}
    result = build(tmp_path, raw)
    assert result.errors == ()
    assert result.config.model_training.trainers == {"absent": {"epochs": 2}, "bare": {}}


def test_unknown_trainer_is_an_error(tmp_path):
    raw = seed_dict()
    raw["model_training"]["trainers"] = {"hf-text-clasification": {}}
    result = build(tmp_path, raw)
    assert result.errors == (Issue(
        "model_training.trainers.hf-text-clasification",
        "model_training.trainers.hf-text-clasification: there is no trainer 'hf-text-clasification'; "
        "did you mean `hf-text-classification`? Trainers: hf-text-classification, decision-calibrate, sklearn-text, "
        "hf-span-tagging, hf-llm-finetune, hf-reward-model, cold-start"),)


# --- SLURM times ---------------------------------------------------------------


@pytest.mark.parametrize("value, seconds", [
    ("30", 30 * 60),
    (30, 30 * 60),
    ("90:30", 90 * 60 + 30),
    ("04:00:00", 4 * 3600),
    ("12:00:00", 12 * 3600),
    ("1-12", 86400 + 12 * 3600),
    ("1-12:30", 86400 + 12 * 3600 + 30 * 60),
    ("2-00:00:10", 2 * 86400 + 10),
    ("UNLIMITED", None),
    ("INFINITE", None),
    ("unlimited", None),
])
def test_parse_slurm_time_every_form(value, seconds):
    assert parse_slurm_time(value) == seconds


@pytest.mark.parametrize("value", ["4h", "", "1:2:3:4", "-5", "1-", True, 1.5, "four"])
def test_parse_slurm_time_rejects_with_the_forms(value):
    with pytest.raises(ValueError) as info:
        parse_slurm_time(value)
    assert str(info.value) == (
        "a SLURM time: MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, "
        'DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS or UNLIMITED (e.g. "04:00:00")')


# --- docs/backends.md ---------------------------------------------------------


def test_backends_doc_is_up_to_date():
    committed = (REPO / "docs" / "backends.md").read_text()
    assert committed == render_backends_doc(), (
        f"docs/backends.md is out of date with the key tables; regenerate it: {DOCS_COMMAND}")


def test_backends_doc_lists_every_key_of_every_table():
    doc = render_backends_doc()
    for keys in (*(t.keys for t in BACKEND_TYPES.values()), config_mod.MODEL_TRAINING_KEYS, config_mod.WRITEBACK_KEYS,
                 config_mod.AUTO_RETRAIN_KEYS):
        for key in keys:
            assert f"| `{key.name}` | {key.doc_kind()} | {key.doc_default()} | {key.meaning} |" in doc
    assert "| `remote_dir` | str | **required** |" in doc
    assert "| `min_free_gpu_mb` | int ≥ 0 | `2000` |" in doc


def test_the_real_trainer_checks_its_options(tmp_path):
    pytest.importorskip("potato.training.trainers.hf_text_classification")
    raw = seed_dict()
    raw["model_training"]["trainers"] = {"hf-text-classification": {"epochs": 0}}
    result = build(tmp_path, raw)
    assert [e.path for e in result.errors] == ["model_training.trainers.hf-text-classification"]
    assert result.errors[0].message.startswith("model_training.trainers.hf-text-classification: epochs")


def test_the_span_trainer_checks_its_options(tmp_path):
    raw = seed_dict()
    raw["model_training"]["trainers"] = {"hf-span-tagging": {"max_length": 64, "stride": 40}}
    result = build(tmp_path, raw)
    assert [e.message for e in result.errors] == [
        "model_training.trainers.hf-span-tagging: stride must be at most half of max_length (32), got 40: "
        "consecutive windows share stride tokens"]
