"""potato.validate: every validation rule, with its exact message and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from potato.config import Issue
from potato.errors import ConfigError
from potato.validate import (
    Acknowledged,
    apply_acknowledgements,
    format_report,
    validate_config_file,
)
from tests.unit.test_config import SEED_CONFIG, seed_dict, write_project

B = "model_training.backends"
SSH_ACCEPTS = ("type, description, host, user, port, identity_file, python, remote_dir, env, "
               "num_threads, gpus, min_free_gpu_mb, max_gpus, processes, packages, max_artifact_mb, fetch_artifacts, "
               "keep_remote, copy_stall_timeout_s, heartbeat_timeout_s")
SLURM_ACCEPTS = ("type, description, host, user, port, identity_file, python, remote_dir, env, "
                 "num_threads, max_artifact_mb, fetch_artifacts, keep_remote, copy_stall_timeout_s, heartbeat_timeout_s, "
                 "job_python, prelude, partition, account, qos, gres, time, mem, cpus_per_task, "
                 "constraint, poll_interval_s")
SLURM_FORMS = ("MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES, "
               'DAYS-HOURS:MINUTES:SECONDS or UNLIMITED (e.g. "04:00:00")')
BACKENDS = "local, gpu-server, cluster, lab-workstation"
LONG_TIME = ("model_training.backends.cluster.time is 12:00:00. A job that holds a GPU for more than "
             "6 hours is long on a shared cluster; check its policy")


def validate(tmp_path: Path, raw: dict | str, **kw):
    return validate_config_file(write_project(tmp_path, raw), **kw)


def backend(raw: dict, name: str) -> dict:
    return raw["model_training"]["backends"][name]


def _set(name, key, value):
    return lambda raw: backend(raw, name).__setitem__(key, value)


def _del(name, key):
    return lambda raw: backend(raw, name).pop(key)


def _mt(key, value):
    return lambda raw: raw["model_training"].__setitem__(key, value)


def _wb(key, value):
    return lambda raw: raw["model_training"]["writeback"].__setitem__(key, value)


ERROR_CASES = {
    "misspelled python": (
        _set("gpu-server", "pyhton", "/usr/bin/python3"),
        f"{B}.gpu-server.pyhton",
        f"{B}.gpu-server.pyhton is not a key of an ssh backend; did you mean `python`? "
        f"Accepted keys: {SSH_ACCEPTS}"),
    "unknown key, nothing close": (
        _set("cluster", "walltime_hours", 4),
        f"{B}.cluster.walltime_hours",
        f"{B}.cluster.walltime_hours is not a key of a slurm backend. Accepted keys: {SLURM_ACCEPTS}"),
    "packages not supported by slurm": (
        _set("cluster", "packages", ["peft"]),
        f"{B}.cluster.packages",
        f"{B}.cluster.packages is not supported by a slurm backend: a venv built on the login node "
        "may not run on the compute nodes; name the compute nodes' interpreter in "
        "job_python and load modules in prelude"),
    "gpus on slurm": (
        _set("cluster", "gpus", "auto"),
        f"{B}.cluster.gpus",
        f"{B}.cluster.gpus is not supported by a slurm backend: the scheduler assigns GPUs; ask for "
        "them with gres (e.g. gres: gpu:1)"),
    "host on an agent": (
        _set("lab-workstation", "host", "ws.example.org"),
        f"{B}.lab-workstation.host",
        f"{B}.lab-workstation.host is not a key of an agent backend. Accepted keys: "
        "type, description, heartbeat_timeout_s, queue_timeout_s"),
    "ssh without host": (
        _del("gpu-server", "host"),
        f"{B}.gpu-server.host",
        f"{B}.gpu-server.host is missing; an ssh backend needs it "
        "(any name `ssh` accepts, `~/.ssh/config` aliases too)"),
    "slurm without host": (
        _del("cluster", "host"),
        f"{B}.cluster.host",
        f"{B}.cluster.host is missing; a slurm backend needs it "
        "(the login node: any name `ssh` accepts, `~/.ssh/config` aliases too)"),
    "host that ssh would read as an option": (
        _set("gpu-server", "host", "-oProxyCommand=touch /tmp/x"),
        f"{B}.gpu-server.host",
        f"{B}.gpu-server.host is '-oProxyCommand=touch /tmp/x'; a host may not start with '-' "
        "(ssh would read it as an option); use the host's name"),
    "empty host": (
        _set("cluster", "host", ""),
        f"{B}.cluster.host",
        f"{B}.cluster.host is ''; use the host's name (any name `ssh` accepts)"),
    "slurm without remote_dir": (
        _del("cluster", "remote_dir"),
        f"{B}.cluster.remote_dir",
        f"{B}.cluster.remote_dir is missing; a slurm backend needs it "
        "(on storage the compute nodes share; not under `/tmp` or `/var/tmp`)"),
    "slurm without job_python": (
        _del("cluster", "job_python"),
        f"{B}.cluster.job_python",
        f"{B}.cluster.job_python is missing; a slurm backend needs it "
        "(interpreter on the compute nodes, with the trainer's packages)"),
    "remote_dir under /tmp": (
        _set("cluster", "remote_dir", "/tmp/potato"),
        f"{B}.cluster.remote_dir",
        f"{B}.cluster.remote_dir is '/tmp/potato', which is under /tmp, a directory local to each "
        "node; use a directory on storage the compute nodes share"),
    "remote_dir is /var/tmp": (
        _set("cluster", "remote_dir", "/var/tmp/"),
        f"{B}.cluster.remote_dir",
        f"{B}.cluster.remote_dir is '/var/tmp/', which is under /var/tmp, a directory local to each "
        "node; use a directory on storage the compute nodes share"),
    "remote_dir sneaking into /tmp": (
        _set("cluster", "remote_dir", "/shared/../tmp/x"),
        f"{B}.cluster.remote_dir",
        f"{B}.cluster.remote_dir is '/shared/../tmp/x', which is under /tmp, a directory local to "
        "each node; use a directory on storage the compute nodes share"),
    "default backend names no backend": (
        _mt("backend", "gpu-servr"),
        "model_training.backend",
        f"model_training.backend is 'gpu-servr', which names no backend; the backends are: "
        f"{BACKENDS}; did you mean `gpu-server`?"),
    "auto_retrain backend names no backend": (
        _mt("auto_retrain", {"enabled": True, "schemas": ["sentiment"], "backend": "elsewhere"}),
        "model_training.auto_retrain.backend",
        f"model_training.auto_retrain.backend is 'elsewhere', which names no backend; the backends "
        f"are: {BACKENDS}"),
    "gpus: maybe": (
        _set("gpu-server", "gpus", "maybe"),
        f"{B}.gpu-server.gpus",
        f"{B}.gpu-server.gpus is 'maybe'; use auto, none, a GPU index such as \"1\" or a list of "
        "indexes such as \"0,1\""),
    'time: "4h"': (
        _set("cluster", "time", "4h"),
        f"{B}.cluster.time",
        f"{B}.cluster.time is '4h'; use a SLURM time: {SLURM_FORMS}"),
    "negative min_free_gpu_mb": (
        _set("gpu-server", "min_free_gpu_mb", -1),
        f"{B}.gpu-server.min_free_gpu_mb",
        f"{B}.gpu-server.min_free_gpu_mb is -1; use a whole number of at least 0"),
    "negative max_wall_seconds": (
        _mt("max_wall_seconds", -5),
        "model_training.max_wall_seconds",
        "model_training.max_wall_seconds is -5; use a number of at least 1"),
    "min_confidence above 1": (
        _wb("min_confidence", 1.5),
        "model_training.writeback.min_confidence",
        "model_training.writeback.min_confidence is 1.5; use a number from 0 to 1"),
    "min_confidence below 0": (
        _wb("min_confidence", -0.1),
        "model_training.writeback.min_confidence",
        "model_training.writeback.min_confidence is -0.1; use a number from 0 to 1"),
    "port as text": (
        _set("gpu-server", "port", "ssh"),
        f"{B}.gpu-server.port",
        f"{B}.gpu-server.port is 'ssh'; use a whole number"),
    "bool as text": (
        _set("gpu-server", "keep_remote", "yes please"),
        f"{B}.gpu-server.keep_remote",
        f"{B}.gpu-server.keep_remote is 'yes please'; use true or false"),
    "prelude as one string": (
        _set("cluster", "prelude", "module load cuda"),
        f"{B}.cluster.prelude",
        f"{B}.cluster.prelude is 'module load cuda'; use a list of strings, e.g. [\"a\", \"b\"]"),
    "env with a number": (
        _set("gpu-server", "env", {"OMP_NUM_THREADS": 1}),
        f"{B}.gpu-server.env",
        f"{B}.gpu-server.env is {{'OMP_NUM_THREADS': 1}}; use a mapping of names to strings "
        "(quote numbers), e.g. PATH: /opt/bin:/usr/bin"),
    "device": (
        _mt("device", "tpu"),
        "model_training.device",
        "model_training.device is 'tpu'; use auto, cpu, gpu, cuda, cuda:N (e.g. cuda:1) or mps"),
    "unknown type": (
        _set("gpu-server", "type", "sshh"),
        f"{B}.gpu-server.type",
        f"{B}.gpu-server.type is 'sshh'; use one of: ssh, slurm, agent; did you mean `ssh`?"),
    "missing type": (
        _del("gpu-server", "type"),
        f"{B}.gpu-server.type",
        f"{B}.gpu-server.type is missing; use one of: ssh, slurm, agent"),
    "local redefined": (
        lambda raw: raw["model_training"]["backends"].__setitem__(
            "local", {"type": "ssh", "host": "gpu.example.org"}),
        f"{B}.local.type",
        f"{B}.local.type is 'ssh'; the name local is reserved for the built-in backend on this "
        "machine; give this backend another name"),
    "backend not a mapping": (
        lambda raw: raw["model_training"]["backends"].__setitem__("gpu-server", "ssh"),
        f"{B}.gpu-server",
        f"{B}.gpu-server is 'ssh'; use a mapping of keys to values, e.g. type: ssh and host: "
        "gpu.example.org"),
    "backend name with a space": (
        lambda raw: raw["model_training"]["backends"].__setitem__("gpu server", {"type": "agent"}),
        f"{B}.gpu server",
        "model_training.backends has a backend named 'gpu server'; a name may hold letters, "
        "digits, '.', '_' and '-', and starts with a letter or digit"),
    "writeback names an unknown schema": (
        _wb("schemas", ["sentiment", "sentimnt"]),
        "model_training.writeback.schemas[1]",
        "model_training.writeback.schemas[1] is 'sentimnt', which is not a schema in "
        "annotation_schemes (it has: sentiment); did you mean `sentiment`?"),
    "data file missing": (
        lambda raw: raw.__setitem__("data_files", ["data/reviews.json", "data/missing.json"]),
        "data_files[1]",
        None),  # message holds tmp_path; checked in its own test
    "scheme without a name": (
        lambda raw: raw["annotation_schemes"].append({"annotation_type": "text"}),
        "annotation_schemes[1].name",
        "annotation_schemes[1] has no name; give each scheme a name (a string)"),
}


@pytest.mark.parametrize("mutate, path, message", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_error_has_its_path_and_message(tmp_path, mutate, path, message):
    raw = seed_dict()
    mutate(raw)
    report = validate(tmp_path, raw)
    assert [e.path for e in report.errors] == [path]
    if message is not None:
        assert report.errors[0].message == message
    assert report.config is None and not report.ok


def test_missing_data_file_names_where_it_looked(tmp_path):
    raw = seed_dict()
    raw["data_files"] = ["data/missing.json"]
    report = validate(tmp_path, raw)
    assert report.errors == (Issue("data_files[0]", (
        f"data_files[0] is 'data/missing.json', which does not exist "
        f"(looked for {str(tmp_path.resolve() / 'data' / 'missing.json')!r}); "
        "data_files are relative to task_dir")),)


def test_every_error_is_reported_not_just_the_first(tmp_path):
    raw = seed_dict()
    backend(raw, "gpu-server")["pyhton"] = "x"
    backend(raw, "gpu-server")["gpus"] = "maybe"
    backend(raw, "cluster")["remote_dir"] = "/tmp/x"
    backend(raw, "cluster")["time"] = "4h"
    raw["model_training"]["backend"] = "nowhere"
    report = validate(tmp_path, raw)
    assert [e.path for e in report.errors] == [
        f"{B}.gpu-server.gpus", f"{B}.gpu-server.pyhton", f"{B}.cluster.time",
        f"{B}.cluster.remote_dir", "model_training.backend"]


@pytest.mark.parametrize("text, message", [
    ("", "is empty; it needs at least task_dir, data_files and item_properties"),
    ("# only a comment\n", "is empty; it needs at least task_dir, data_files and item_properties"),
    ("- a\n- b\n", "must be a mapping of keys to values at its top level, not a list"),
    ('"just text"\n', "must be a mapping of keys to values at its top level, not a string"),
    ("task_dir: .\nmodel_training:\n  backends: [\n", "is not valid YAML at line 4, column 1: "
     "expected the node content, but found '<stream end>'"),
    ("a: 1\n b: 2\n", "is not valid YAML at line 2, column 3: mapping values are not allowed here"),
])
def test_file_level_errors(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    report = validate_config_file(path)
    assert report.errors == (Issue("", f"Config file {str(path)!r} {message}"),)


def test_missing_file(tmp_path):
    report = validate_config_file(tmp_path / "nope.yaml")
    assert report.errors == (Issue("", f"Config file {str(tmp_path / 'nope.yaml')!r} does not exist; "
                                       "check the path"),)


# --- warnings -------------------------------------------------------------------


def test_unknown_model_training_key_is_a_warning_with_did_you_mean(tmp_path):
    raw = seed_dict()
    raw["model_training"]["max_wall_second"] = 60
    report = validate(tmp_path, raw)
    assert report.ok
    assert report.warnings == (Issue("model_training.max_wall_second", (
        "model_training.max_wall_second is not a key of model_training; did you mean "
        "`max_wall_seconds`? Accepted keys: enabled, backend, max_wall_seconds, grace_seconds, "
        "heartbeat_timeout_s, device, num_threads, max_ram_mb, max_predictions_mb, "
        "holdout_fraction, splits, split_seed, aggregation, stable_below, retain_runs, writeback, auto_retrain, "
        "backends, trainers, prefect_deployment, license, report_to")),)


def test_long_slurm_time_warns_word_for_word(tmp_path):
    report = validate(tmp_path, SEED_CONFIG.replace('"04:00:00"', '"12:00:00"'))
    assert report.ok and report.errors == ()
    assert report.warnings == (Issue("model_training.backends.cluster.time", LONG_TIME),)
    assert report.passes() and not report.passes(strict=True)
    assert report.config.warnings == report.warnings  # what the server prints


@pytest.mark.parametrize("time, warns", [
    ("06:00:00", False), ("360", False), ("0-06", False), ("06:00:01", True), ("1-00", True),
    ("UNLIMITED", True), ("361", True),
])
def test_six_hours_is_the_line(tmp_path, time, warns):
    report = validate(tmp_path, SEED_CONFIG.replace('"04:00:00"', f'"{time}"'))
    expected = (f"{B}.cluster.time is {time}. A job that holds a GPU for more than 6 hours is long "
                "on a shared cluster; check its policy")
    assert [w.message for w in report.warnings] == ([expected] if warns else [])


def test_debug_with_an_ssh_backend_warns(tmp_path):
    raw = seed_dict()
    raw["debug"] = True
    del raw["model_training"]["backends"]["cluster"]
    report = validate(tmp_path, raw)
    assert [w.message for w in report.warnings] == [
        "debug is true and backend(s) gpu-server train over ssh: with debug on, this server grants admin rights "
        "to every loopback request, and requests through an ssh run's forwarded socket arrive from loopback. "
        "Set debug: false in the config on a server that trains over ssh"]


# --- acknowledge ----------------------------------------------------------------

ACK = '\nvalidation:\n  acknowledge:\n    - "model_training.backends.cluster.time is"\n'


def test_acknowledged_warning_moves_to_its_own_list(tmp_path):
    text = SEED_CONFIG.replace('"04:00:00"', '"12:00:00"') + ACK
    report = validate(tmp_path, text, apply_acknowledge=True)
    assert report.warnings == ()
    assert report.acknowledged == (Acknowledged("model_training.backends.cluster.time", LONG_TIME,
                                                 "model_training.backends.cluster.time is"),)
    assert report.passes(strict=True)


def test_the_server_ignores_acknowledge(tmp_path):
    text = SEED_CONFIG.replace('"04:00:00"', '"12:00:00"') + ACK
    report = validate(tmp_path, text)
    assert [w.message for w in report.warnings] == [LONG_TIME] and report.acknowledged == ()
    assert report.raise_for_errors().warnings == report.warnings


def test_an_entry_naming_a_backend_acknowledges_that_backend_only(tmp_path):
    raw = seed_dict()
    backend(raw, "cluster")["time"] = "12:00:00"
    raw["model_training"]["backends"]["cluster2"] = dict(backend(raw, "cluster"), time="2-00")
    raw["validation"] = {"acknowledge": ["model_training.backends.cluster.time is"]}
    report = validate(tmp_path, raw, apply_acknowledge=True)
    assert [a.path for a in report.acknowledged] == [f"{B}.cluster.time"]
    assert [w.path for w in report.warnings] == [f"{B}.cluster2.time"]
    assert not report.passes(strict=True)


def test_too_short_and_unmatched_entries_are_warnings(tmp_path):
    raw = seed_dict()
    backend(raw, "cluster")["time"] = "12:00:00"
    raw["validation"] = {"acknowledge": ["time is", "holds a GPU", "no such warning at all",
                                         "more than 6 hours"]}
    report = validate(tmp_path, raw, apply_acknowledge=True)
    assert [a.entry for a in report.acknowledged] == ["more than 6 hours"]
    assert report.warnings == (
        Issue("validation.acknowledge[0]",
              "validation.acknowledge[0] is 'time is' (7 characters); an entry needs at least 12 "
              "characters of a warning's text, so it cannot match warnings by accident"),
        Issue("validation.acknowledge[1]",
              "validation.acknowledge[1] is 'holds a GPU' (11 characters); an entry needs at least 12 "
              "characters of a warning's text, so it cannot match warnings by accident"),
        Issue("validation.acknowledge[2]",
              "validation.acknowledge[2] is 'no such warning at all', which matches no warning; "
              "remove it or copy part of a warning's text"),
    )
    assert report.passes() and not report.passes(strict=True)


def test_matching_is_case_sensitive(tmp_path):
    warnings = (Issue("p", LONG_TIME),)
    left, acknowledged, problems = apply_acknowledgements(warnings, ["MODEL_TRAINING.backends.cluster"])
    assert left == warnings and acknowledged == ()
    assert [p.path for p in problems] == ["validation.acknowledge[0]"]


def test_one_entry_may_acknowledge_several_warnings():
    warnings = (Issue("a", "model_training.backends.a.time is 1-00. x"),
                Issue("b", "model_training.backends.b.time is 1-00. x"))
    left, acknowledged, problems = apply_acknowledgements(warnings, ["model_training.backends"])
    assert left == () and len(acknowledged) == 2 and problems == ()


@pytest.mark.parametrize("block, message", [
    ("validation: yes\n", "validation is True; use a mapping with the key acknowledge "
                          "(a list of warning texts)"),
    ("validation:\n  acknowledge: model_training.backends\n",
     "validation.acknowledge is 'model_training.backends'; use a list of strings, each part of a "
     "warning's text"),
    ("validation:\n  acknowlege: []\n",
     "validation.acknowlege is not a key of validation; did you mean `acknowledge`? "
     "Accepted keys: acknowledge"),
])
def test_malformed_validation_block_is_a_warning(tmp_path, block, message):
    report = validate(tmp_path, SEED_CONFIG + block, apply_acknowledge=True)
    assert report.ok and [w.message for w in report.warnings] == [message]


# --- report -----------------------------------------------------------------------


def test_raise_for_errors_lists_every_error(tmp_path):
    raw = seed_dict()
    del backend(raw, "gpu-server")["host"]
    report = validate(tmp_path, raw)
    with pytest.raises(ConfigError) as info:
        report.raise_for_errors()
    assert str(info.value) == (f"{tmp_path / 'config.yaml'} has 1 error:\n"
                               f"  - {B}.gpu-server.host is missing; an ssh backend needs it "
                               "(any name `ssh` accepts, `~/.ssh/config` aliases too)")


def test_human_report_order_and_summary(tmp_path):
    raw = seed_dict()
    backend(raw, "cluster")["time"] = "12:00:00"
    backend(raw, "gpu-server")["gpus"] = "maybe"
    raw["model_training"]["max_wall_second"] = 1
    raw["validation"] = {"acknowledge": ["cluster.time is 12"]}
    report = validate(tmp_path, raw, apply_acknowledge=True)
    lines = format_report(report).splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["error", "warning", "acknowledged"]
    assert lines[2] == f"acknowledged: {LONG_TIME} (by 'cluster.time is 12')"
    assert lines[-1] == f"{tmp_path / 'config.yaml'}: invalid (1 error, 1 warning, 1 acknowledged)"


def test_json_shape(tmp_path):
    report = validate(tmp_path, SEED_CONFIG.replace('"04:00:00"', '"12:00:00"'), apply_acknowledge=True)
    assert report.to_json(strict=True) == {
        "ok": False,
        "errors": [],
        "warnings": [{"path": f"{B}.cluster.time", "message": LONG_TIME}],
        "acknowledged": [],
    }
    assert report.to_json()["ok"] is True


@pytest.mark.parametrize("name, key, value, where, bad", [
    ("cluster", "partition", "gpu\nrm -rf ~", "cluster.partition", "gpu\nrm -rf ~"),
    ("cluster", "prelude", ["module load cuda/12.4", "source env\r"], "cluster.prelude[1]", "source env\r"),
    ("cluster", "job_python", "/shared/envs/train/bin/python\x00", "cluster.job_python", "/shared/envs/train/bin/python\x00"),
    ("gpu-server", "env", {"PATH": "/opt/bin:/usr/bin\n"}, "gpu-server.env.PATH", "/opt/bin:/usr/bin\n"),
    ("gpu-server", "env", {"PA\tTH": "/opt/bin"}, "gpu-server.env (a name)", "PA\tTH"),
    ("gpu-server", "host", "gpu.example.org\nProxyCommand x", "gpu-server.host", "gpu.example.org\nProxyCommand x"),
    ("gpu-server", "packages", ["peft\n--index-url http://evil"], "gpu-server.packages[0]", "peft\n--index-url http://evil"),
])
def test_control_characters_are_refused_in_every_key_that_reaches_a_command_or_a_file(tmp_path, name, key, value,
                                                                                        where, bad):
    raw = seed_dict()
    backend(raw, name)[key] = value
    report = validate(tmp_path, raw)
    assert [(e.path, e.message) for e in report.errors] == [(
        f"{B}.{name}.{key}", f"{B}.{where} is {bad!r}; it holds a control character, which would break the "
        "command line or job.sh it goes into; remove it")]


def test_a_description_may_hold_a_newline(tmp_path):
    raw = seed_dict()
    backend(raw, "cluster")["description"] = "the cluster\n(ask Ann for an account)"
    assert validate(tmp_path, raw).ok
