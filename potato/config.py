"""The project's config, typed: parsed once at the edge into frozen dataclasses.

CONTRACT (other modules rely on these names; keep them):

- ``load_config(path) -> ProjectConfig`` reads and validates; raises ``ConfigError``
  with every error (key path + fix) when the config is invalid.
- ``ProjectConfig``: ``path`` (absolute config file), ``task_dir``, ``data_files``
  (absolute Paths), ``id_key``, ``text_key``, ``output_annotation_dir`` (absolute),
  ``admin_api_key``, ``debug``, ``schemes`` (tuple of ``Scheme``),
  ``model_training`` (``ModelTrainingConfig``), ``raw`` (the parsed YAML dict),
  ``training_dir`` (``<output_annotation_dir>/training``: run store, run dirs,
  Prefect home, writeback file).
- ``ModelTrainingConfig``: ``enabled``, ``backend`` (default backend name, "local"
  when unset), ``max_wall_seconds`` (None = no limit), ``grace_seconds`` (20),
  ``heartbeat_timeout_s`` (120), ``device`` ("auto"), ``num_threads``,
  ``max_ram_mb``, ``max_predictions_mb`` (512), ``holdout_fraction`` (0.2),
  ``writeback`` (``WritebackConfig``), ``auto_retrain`` (``AutoRetrainConfig``),
  ``trainers`` (trainer name -> options dict), ``backends`` (name ->
  ``BackendConfig``; always holds ``local``).
- ``BackendConfig``: ``name``, ``type``, ``options`` (every key of the type's
  table, defaults applied), ``get(key)``, ``host``, ``type_info`` (what the type
  declares in ``potato.backend_types.type_registry``), ``describe()`` (the Runs on menu
  text, e.g. ``gpu-server (ssh to gpu.example.org)``).

Added here (also public):

- ``ProjectConfig.warnings``: the config's warnings (``Issue`` tuple), for the
  server to print at start-up.
- ``Issue(path, message)``: one error or warning; ``message`` is a whole
  sentence that starts with the key path where there is one.
- ``read_config_file(path) -> (raw | None, errors)`` and
  ``build_config(raw, path) -> BuildResult`` — the two halves of
  ``load_config``, used by ``potato validate`` to report instead of raise.
- ``Key`` (``potato.config_keys``) and the tables ``MODEL_TRAINING_KEYS``,
  ``WRITEBACK_KEYS``, ``AUTO_RETRAIN_KEYS``; each backend type's keys are its
  declaration's (``potato.backends``). ``KINDS``: the kinds of value a key takes.
- ``parse_slurm_time(value) -> int | None`` (seconds; None = unlimited).
- Beside Potato 2.12 (one config for both): ``POTATO_212_KEYS`` (each of its
  ``model_training`` keys and what this project does with it);
  ``ModelTrainingConfig.splits``/``split_seed`` (None unless set; its ``test``
  split is then the holdout), ``aggregation`` ("majority" | "consensus"),
  ``retain_runs`` (None = keep all); ``WritebackConfig.field``;
  ``AutoRetrainConfig`` ``trainer``, ``schemas``, ``update_frequency``,
  ``min_interval_s``, ``params``, ``backend``; ``ProjectConfig.data_file_encodings``
  (path -> encoding), ``data_directory`` (absolute Path or None),
  ``data_directory_encoding``; ``data_directory_files(directory)`` (the files
  2.12 reads there). A source or label store this project cannot read is an
  error here, never an empty bundle later.
- ``render_backends_doc()``: docs/backends.md, from the tables
  (``python -m potato.config --docs > docs/backends.md``).
"""

from __future__ import annotations

import codecs
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from potato.backend_types.contract import BackendType
from potato.backend_types.local import LOCAL
from potato.backend_types.type_registry import BACKEND_TYPES, backend_type, configurable_types
from potato.closest_name import did_you_mean
from potato.config_keys import (
    SLURM_TIME_FORMS,
    TRACKERS,
    TRACKERS_NOT_HERE,
    Issue,
    Issues,
    Key,
    parse_slurm_time,
)
from potato.errors import ConfigError
from potato.scheme_fields import BwsConfig, read_bws_config
from potato.training.answer_kinds import BEST_WORST, ORDER_ONLY_KINDS
from potato.training.trainers.registry import TRAINERS
from potato.training.trainers.registry import check_options as check_trainer_options
from potato.training.trainers.uncertainty import DEFAULT_BATCH, DEFAULT_STRATEGY, MAX_BATCH, STRATEGIES

# ---------------------------------------------------------------------------
# Typed config
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scheme:
    """One annotation scheme; ``potato.scheme_fields`` reads the fields that shape its answers.

    ``labels``: the labels in schema order (a likert without ``labels:`` has
    its points, ``"1"`` … ``str(size)``; a pairwise its sides, ``A`` and
    ``B``). ``size``: a likert's number of points.
    ``min_value``/``max_value``/``step``: a slider's range, a pairwise scale's.
    """

    name: str
    annotation_type: str
    labels: tuple[str, ...]
    description: str = ""
    size: int | None = None
    min_value: float | None = None
    max_value: float | None = None
    step: float | None = None
    # pairwise: its mode and the item's field holding the two responses.
    mode: str = ""
    items_key: str = ""

    @property
    def kind(self) -> str:
        """The kind of its answers (``potato.training.answer_kinds``: nominal, ordinal, …, unsupported)."""
        from potato.scheme_fields import answer_kind

        return answer_kind(self.annotation_type, self.labels, self.mode)


@dataclass(frozen=True)
class WritebackConfig:
    schemas: tuple[str, ...] = ()
    include_unlabeled: bool = False
    min_confidence: float = 0.0
    field: str = "predictions"
    live: bool = False  # also into the items' own records in the watched data_directory (potato.results.live_writeback)
    order: str = DEFAULT_STRATEGY  # the order Potato 2.12 serves items in under model_review (potato.prefill.review_order)
    order_batch: int | None = None  # the diverse order's batch; None: auto_retrain's update_frequency, else 50
    gate: bool = True  # hold back a run no better than the trivial baseline or the live run (potato.results.quality_gate)
    gate_confidence: float = 0.9
    min_holdout: int = 5


@dataclass(frozen=True)
class AutoRetrainConfig:
    """``model_training.auto_retrain``: Potato 2.12's keys plus ``backend`` (None = the default backend)."""

    enabled: bool = False
    trainer: str | None = None  # None: each schema's kind's default trainer
    schemas: tuple[str, ...] = ()
    update_frequency: int = 25
    min_interval_s: float = 600
    params: Mapping[str, Any] = field(default_factory=dict)
    backend: str | None = None


@dataclass(frozen=True)
class BackendConfig:
    name: str
    type: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.options.get(key)
        return default if value is None else value

    @property
    def host(self) -> str | None:
        return self.options.get("host")

    @property
    def type_info(self) -> BackendType:
        """What its type declares: keys, capabilities, where its code is (``potato.backend_types.type_registry``)."""
        return backend_type(self.type)

    def describe(self) -> str:
        """The Runs on menu's text for this backend, e.g. ``gpu-server (ssh to gpu.example.org)``."""
        return self.type_info.describe(self.name, self.host)


LOCAL_BACKEND = BackendConfig(name="local", type=LOCAL.name, options={})


@dataclass(frozen=True)
class ModelTrainingConfig:
    enabled: bool = False
    backend: str = "local"
    max_wall_seconds: float | None = None
    grace_seconds: float = 20
    heartbeat_timeout_s: float = 120
    device: str = "auto"
    num_threads: int | None = None
    max_ram_mb: int | None = None
    max_predictions_mb: int = 512
    holdout_fraction: float = 0.2
    # Potato 2.12's split: when either is set, its `test` split is the holdout.
    splits: Mapping[str, float] | None = None
    split_seed: int | None = None
    aggregation: str = "majority"
    retain_runs: int | None = None
    stable_below: float = 0.01  # the stopping signal's threshold (potato.results.stability)
    writeback: WritebackConfig = field(default_factory=WritebackConfig)
    auto_retrain: AutoRetrainConfig = field(default_factory=AutoRetrainConfig)
    trainers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    prefect_deployment: str | None = None
    license: str | None = None
    report_to: tuple[str, ...] = ()  # experiment trackers (potato.trackers)
    backends: Mapping[str, BackendConfig] = field(
        default_factory=lambda: {"local": LOCAL_BACKEND}
    )

    def heartbeat_timeout(self, backend: str) -> float:
        """How long the worker or agent of a run on *backend* may say nothing (its own setting, else 120)."""
        found = self.backends.get(backend)
        value = found.get("heartbeat_timeout_s") if found is not None else None
        return float(value or self.heartbeat_timeout_s)


# The directory under output_annotation_dir where training keeps everything (runs.db, run
# directories, the writeback file). Potato 2.12 would take it for an annotator's directory
# if a user named it so; the label reader never reads it.
TRAINING_DIR = "training"
# In it, the writeback file: what Potato 2.12 reads through pre_annotation.predictions_file (potato.results.writeback).
WRITEBACK_FILE = "predictions.jsonl"


@dataclass(frozen=True)
class ProjectConfig:
    path: Path
    task_dir: Path
    data_files: tuple[Path, ...]
    id_key: str
    text_key: str
    output_annotation_dir: Path
    admin_api_key: str | None
    schemes: tuple[Scheme, ...]
    model_training: ModelTrainingConfig
    debug: bool = False
    annotation_task_name: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[Issue, ...] = ()
    # Encodings of data files whose entry names one (`{path: ..., encoding: latin-1}`).
    data_file_encodings: Mapping[Path, str] = field(default_factory=dict)
    data_directory: Path | None = None
    data_directory_encoding: str = "utf-8"
    # Best–worst scaling: 2.12 serves tuples of the items instead of the items (potato.items.bws_tuples).
    bws: BwsConfig | None = None

    @property
    def training_dir(self) -> Path:
        return self.output_annotation_dir / TRAINING_DIR

    @property
    def writeback_file(self) -> Path:
        return self.training_dir / WRITEBACK_FILE

    def scheme(self, name: str) -> Scheme | None:
        return next((s for s in self.schemes if s.name == name), None)


# ---------------------------------------------------------------------------
# Value kinds: each checker returns the normalised value or raises
# ValueError(what to use instead), which becomes "<path> is <value!r>; use …".
# ---------------------------------------------------------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError("a string (quote it in YAML)")


def _check_int(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError("a whole number")


def _check_float(value: Any) -> float:
    if _is_number(value) and math.isfinite(value):
        return value
    raise ValueError("a number")


def _check_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError("true or false")


def _check_str_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError('a list of strings, e.g. ["a", "b"]')


def _check_str_mapping(value: Any) -> dict[str, str]:
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return dict(value)
    raise ValueError("a mapping of names to strings (quote numbers), e.g. PATH: /opt/bin:/usr/bin")


def _check_mapping(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    raise ValueError("a mapping of keys to values")


def _check_gpus(value: Any) -> str:
    # YAML reads `gpus: 1` as an int; it plainly means GPU 1.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        if text in ("auto", "none") or re.fullmatch(r"\d+(,\d+)*", text.replace(" ", "")):
            return text.replace(" ", "")
    raise ValueError('auto, none, a GPU index such as "1" or a list of indexes such as "0,1"')


def _check_slurm_time(value: Any) -> str:
    parse_slurm_time(value)
    return str(value)


def _check_device(value: Any) -> str:
    # `gpu` is what Potato 2.12 configs say: any GPU torch can use, CUDA first.
    if isinstance(value, str) and re.fullmatch(r"auto|cpu|gpu|mps|cuda(:\d+)?", value):
        return value
    raise ValueError("auto, cpu, gpu, cuda, cuda:N (e.g. cuda:1) or mps")


SPLIT_NAMES = ("train", "val", "test")
# Potato 2.12's default split (its training/dataset.py DEFAULT_SPLITS).
DEFAULT_SPLITS: Mapping[str, float] = {"train": 0.7, "val": 0.15, "test": 0.15}


def _check_splits(value: Any) -> dict[str, float]:
    # Potato 2.12's `splits`; bands are cut in the order written, so keep it.
    if (isinstance(value, dict) and value and set(value) <= set(SPLIT_NAMES)
            and all(_is_number(v) and 0 <= v < float("inf") for v in value.values())
            and sum(value.values()) > 0):
        return {str(k): float(v) for k, v in value.items()}
    raise ValueError("a mapping of train, val and test to fractions, e.g. {train: 0.8, val: 0.1, test: 0.1}")


AGGREGATIONS = ("majority", "consensus")


def _check_aggregation(value: Any) -> str:
    if value in AGGREGATIONS:
        return value
    raise ValueError("majority (most votes) or consensus (Dawid-Skene, weighs annotators by reliability)")


# kind name (as the docs show it) -> checker
KINDS: Mapping[str, Callable[[Any], Any]] = {
    "str": _check_str,
    "int": _check_int,
    "float": _check_float,
    "bool": _check_bool,
    "list of str": _check_str_list,
    "mapping str->str": _check_str_mapping,
    "mapping": _check_mapping,
    "`gpus` spec": _check_gpus,
    "SLURM time": _check_slurm_time,
    "device": _check_device,
    "splits": _check_splits,
    "aggregation": _check_aggregation,
}


# ---------------------------------------------------------------------------
# The tables of model_training's own keys (each backend type declares its
# entry's in potato.backends). Validation, defaults, the unknown-key error
# and docs/backends.md all read them.
# ---------------------------------------------------------------------------

MODEL_TRAINING_KEYS: tuple[Key, ...] = (
    Key("enabled", "bool", "Potato 2.12's switch for its own in-process training; this project trains "
        "either way. In a config shared with a Potato 2.12 server set it `false`, so that only this "
        "project trains (docs/beside-potato-2.12.md)", default=False),
    Key("backend", "str", "the backend runs use by default (the Runs on menu's first choice)",
        default="local"),
    Key("max_wall_seconds", "float", "stop any run not finished within this many seconds",
        minimum=1, default_text="— (no limit)"),
    Key("grace_seconds", "float", "after SIGTERM, wait this long before SIGKILL", default=20, minimum=0),
    Key("heartbeat_timeout_s", "float", "default for each backend's `heartbeat_timeout_s`",
        default=120, minimum=1),
    Key("device", "device", "local runs: `auto` (CUDA, then Apple Metal, then CPU), `cpu`, `gpu` (CUDA, "
        "then Apple Metal; the CPU with a warning when neither is there), `cuda`, `cuda:N`, `mps`",
        default="auto"),
    Key("num_threads", "int", "local runs: torch threads and `OMP_NUM_THREADS`", minimum=1),
    Key("max_ram_mb", "int", "local runs: the worker stops when its memory passes this", minimum=1),
    Key("max_predictions_mb", "int", "the server answers 413 to a larger predictions upload",
        default=512, minimum=1),
    Key("holdout_fraction", "float", "share of labelled items held out for scoring (unless `splits` "
        "or `split_seed` is set); `0` trains on every label, and runs then have no holdout scores",
        default=0.2, minimum=0, maximum=1),
    Key("splits", "splits", "Potato 2.12's split: fractions of `train`, `val`, `test`; the `test` items "
        "are held out for scoring, the rest are trained on", default_text="— (`holdout_fraction`); "
        "with only `split_seed` set, `{train: 0.7, val: 0.15, test: 0.15}`"),
    Key("split_seed", "int", "seeds Potato 2.12's split (the same item lands in the same split on every "
        "run and backend)", default_text="— (`holdout_fraction`); `0` when `splits` is set"),
    Key("aggregation", "aggregation", "how several annotators' labels become one: `majority` (most votes, "
        "ties to the label listed first) or `consensus` (Dawid-Skene)", default="majority"),
    Key("stable_below", "float", "the stopping signal: when fewer than this share of the unlabelled items' "
        "predicted labels changed since the previous run of a schema, the run log, `potato training runs` and "
        "the Training page say its predictions have settled", default=0.01, minimum=0, maximum=1),
    Key("retain_runs", "int", "keep the directories of the newest this many succeeded training runs and "
        "of every run that finished after them; older ones are deleted (their records stay; a queued or "
        "running run, one whose predictions are written back, and the run a kept decision-calibrate run "
        "calibrated are never touched)", minimum=1, default_text="— (keep all)"),
    Key("writeback", "mapping", "which predictions are written back (table below)", default={}),
    Key("auto_retrain", "mapping", "retrain automatically (table below)", default={}),
    Key("backends", "mapping", "backend name -> backend (tables below); `local` always exists",
        default={}),
    Key("trainers", "mapping", "trainer name -> that trainer's options", default={}),
    Key("prefect_deployment", "str", "start runs through this Prefect deployment (e.g. `training-run/potato`) "
        "instead of a child process of the server", default_text="— (child process)"),
    Key("license", "str", "the license of models published to the Hugging Face Hub (their card's `license`), "
        "e.g. `apache-2.0`; a publish request's own `license` wins", default_text="— (none stated)"),
    Key("report_to", "list of str", "experiment trackers the annotation server reports each run to, from the "
        "events it receives (a GPU host needs no route to them): `mlflow` (`MLFLOW_TRACKING_URI`, "
        "`MLFLOW_EXPERIMENT_NAME`), `tensorboard` (event files under `training/tensorboard/`), `wandb` "
        "(`WANDB_PROJECT`, `WANDB_MODE=offline`); docs/trackers.md",
        default=()),
)

WRITEBACK_KEYS: tuple[Key, ...] = (
    Key("schemas", "list of str", "schemas whose predictions are written back (names in `annotation_schemes`)",
        default=()),
    Key("include_unlabeled", "bool", "also predict items nobody has labelled yet", default=False),
    Key("min_confidence", "float", "keep only predictions at or above this confidence",
        default=0.0, minimum=0, maximum=1),
    Key("field", "str", "the key each written-back record holds its predictions under; Potato 2.12 "
        "reads the one its `pre_annotation.field` names", default="predictions"),
    Key("live", "bool", "also put each item's predictions into its own record in the watched "
        "`data_directory` (this one field only, every other byte kept), where a running Potato 2.12 shows "
        "them within `watch_poll_interval`, without a restart", default=False),
    Key("order", "str", "under `assignment_strategy: model_review`, the order Potato 2.12 serves items in: "
        "`margin` (the gap between the two likeliest labels), `entropy`, `least-confidence` (2.12's own: the "
        "lowest confidence) or `diverse` (the most uncertain items spread over the model's embeddings); "
        "docs/answer-types.md, \"The order under model_review\"", default=DEFAULT_STRATEGY),
    Key("order_batch", "int", "how many items annotators label between two runs, which the `diverse` order and "
        "cold start spread", minimum=1, maximum=MAX_BATCH,
        default_text=f"`auto_retrain.update_frequency` when auto-retraining, else {DEFAULT_BATCH}"),
    Key("gate", "bool", "the quality gate: a schema whose run is no better than the trivial baseline (the "
        "commonest label, the mean, no span) or than the run annotators see now, or that gives one label to "
        "every item, is not written back until `potato training promote`; docs/trainers.md, \"The quality "
        "gate\"", default=True),
    Key("gate_confidence", "float", "how sure the gate must be, over bootstrap resamples of the held-out "
        "answers, that a run beats the baseline (or is worse than the live run)", default=0.9,
        minimum=0.5, maximum=0.999),
    Key("min_holdout", "int", "below this many held-out answers of a schema the gate cannot judge a run, and "
        "its predictions are written back unjudged", default=5, minimum=1),
)

AUTO_RETRAIN_KEYS: tuple[Key, ...] = (
    Key("enabled", "bool", "`potato start` queues a run as annotations arrive", default=False),
    Key("trainer", "str", "the trainer of automatic runs; it must train every schema in `schemas`",
        default_text="each schema's kind's default trainer (docs/answer-types.md)"),
    Key("schemas", "list of str", "the schemas automatic runs train (names in `annotation_schemes`)",
        default=(), default_text="**required** when `enabled`"),
    Key("update_frequency", "int", "queue a run once this many annotations (one item labelled by one "
        "annotator) were made since the last automatic run", default=25, minimum=1),
    Key("min_interval_s", "float", "and at least this many seconds have passed since the last run ended",
        default=600, minimum=0),
    Key("params", "mapping", "the trainer's options for automatic runs (as under `trainers`)", default={}),
    Key("backend", "str", "where automatic runs go", default_text="`model_training.backend`"),
)

# Potato 2.12.1's own `model_training` keys (its config_module.KNOWN_CONFIG_KEYS
# and training/manager.py), each with what this project does with it. Every one
# is accepted without a warning; docs/backends.md shows this table.
POTATO_212_KEYS: tuple[tuple[str, str], ...] = (
    ("enabled", "accepted; not needed here (this project trains whenever its `potato start` or CLI "
     "is asked to). Set it `false` in a shared config: Potato 2.12 then neither trains nor "
     "auto-retrains, so the two never both train on one trigger; `potato validate` warns when it "
     "is `true` together with `auto_retrain.enabled`"),
    ("retain_runs", "honoured: run directories older than the newest N succeeded training runs are "
     "deleted, unless their predictions are written back (2.12 keeps its directories and trims its ledger); "
     "unset keeps all"),
    ("grace_seconds", "honoured: SIGTERM, then SIGKILL after this many seconds"),
    ("split_seed", "honoured: 2.12's seeded split of item ids"),
    ("splits", "honoured: the `test` fraction is held out for scoring; `train` and `val` are trained on"),
    ("aggregation", "honoured: `majority` or `consensus` (Dawid-Skene); unset is `majority` here "
     "(2.12: `consensus`)"),
    ("auto_retrain", "honoured by `potato start` (keys below), plus `backend`"),
    ("auto_retrain.enabled", "honoured"),
    ("auto_retrain.trainer", "honoured: a trainer of this project that trains every schema of "
     "`auto_retrain.schemas` (`sklearn-text`, 2.12's own, included, with its `params`); unset, each "
     "schema's kind's default trainer"),
    ("auto_retrain.schemas", "honoured; required when enabled"),
    ("auto_retrain.update_frequency", "honoured (default 25), counted as 2.12 counts"),
    ("auto_retrain.min_interval_s", "honoured (default 600)"),
    ("auto_retrain.params", "honoured: the trainer's options, checked at validate time"),
    ("max_wall_seconds", "honoured: the run is stopped"),
    ("max_ram_mb", "honoured for local runs"),
    ("device", "honoured for local runs; 2.12's `gpu` means a GPU if there is one (CUDA, then "
     "Apple Metal), else the CPU with a warning in the run log"),
    ("num_threads", "honoured for local runs (ssh and slurm backends have their own)"),
    ("writeback", "honoured (keys below); predictions go to a file that 2.12 reads through "
     "`pre_annotation.predictions_file`, not into its item data"),
    ("writeback.schemas", "honoured; empty writes nothing back"),
    ("writeback.min_confidence", "honoured"),
    ("writeback.field", "honoured: the key of each record's predictions (match `pre_annotation.field`)"),
    ("writeback.include_unlabeled", "honoured: items nobody labelled are predicted and written back"),
)

_BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# ---------------------------------------------------------------------------
# Reading the file
# ---------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 numbers.

    PyYAML reads an unquoted ``time: 12:00:00`` as the int 43200 (sexagesimal),
    which SLURM would then take as 43200 *minutes*; here it stays a string.
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (
        "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def read_config_file(path: str | Path) -> tuple[Mapping[str, Any] | None, tuple[Issue, ...]]:
    """Parse the YAML at *path*: ``(mapping, ())`` or ``(None, (error,))``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, (Issue("", f"Config file {str(path)!r} does not exist; check the path"),)
    except IsADirectoryError:
        return None, (Issue("", f"Config file {str(path)!r} is a directory; name the YAML file"),)
    except (OSError, UnicodeDecodeError) as exc:
        return None, (Issue("", f"Config file {str(path)!r} cannot be read: {exc}"),)
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 — a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        return None, (Issue("", f"Config file {str(path)!r} is not valid YAML{where}: {problem}"),)
    except yaml.YAMLError as exc:
        return None, (Issue("", f"Config file {str(path)!r} is not valid YAML: {exc}"),)
    if raw is None:
        return None, (Issue("", f"Config file {str(path)!r} is empty; it needs at least "
                                "task_dir, data_files and item_properties"),)
    if not isinstance(raw, dict):
        return None, (Issue("", f"Config file {str(path)!r} must be a mapping of keys to values "
                                f"at its top level, not a {_type_name(raw)}"),)
    return raw, ()


# ---------------------------------------------------------------------------
# Building: every check adds an Issue, so one pass reports every error.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildResult:
    """What ``build_config`` found: the config (None when there are errors) and the issues."""

    config: ProjectConfig | None
    errors: tuple[Issue, ...]
    warnings: tuple[Issue, ...]


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean",
            int: "number", float: "number"}.get(type(value), type(value).__name__)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _check_value(key: Key, value: Any, path: str, issues: Issues) -> tuple[bool, Any]:
    """(ok, normalised value) for *value* of *key*; a wrong one adds an error."""
    try:
        value = KINDS[key.kind](value)
    except ValueError as exc:
        issues.error(path, f"{path} is {value!r}; use {exc}")
        return False, None
    if key.minimum is not None and _is_number(value):
        if key.maximum is not None and not key.minimum <= value <= key.maximum:
            issues.error(path, f"{path} is {value!r}; use a number from {key.minimum:g} to {key.maximum:g}")
            return False, None
        if value < key.minimum:
            whole = "whole number" if key.kind == "int" else "number"
            issues.error(path, f"{path} is {value!r}; use a {whole} of at least {key.minimum:g}")
            return False, None
    return True, value


def _check_table(
    table: tuple[Key, ...],
    values: Mapping[str, Any],
    path: str,
    what: str,
    issues: Issues,
    *,
    unknown: str = "error",
    skip: tuple[str, ...] = (),
    unsupported: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Check *values* against *table*; return every key with defaults applied.

    Unknown keys are errors (``unknown="error"``), warnings (``"warn"``) or
    passed through (``"keep"``). Keys in *skip* are checked by the caller.
    *unsupported* names keys users carry over from elsewhere, with why not and the fix.
    """
    unsupported = unsupported or {}
    by_name = {k.name: k for k in table}
    result: dict[str, Any] = {}
    for name, value in values.items():
        key_path = _join(path, name)
        key = by_name.get(name)
        if key is None:
            if unknown == "keep":
                result[name] = value
                continue
            if name in unsupported:
                issues.error(key_path, f"{key_path} is not supported by {what}: {unsupported[name]}")
                continue
            message = (f"{key_path} is not a key of {what}{did_you_mean(name, by_name, '.')} "
                       f"Accepted keys: {', '.join(by_name)}")
            (issues.error if unknown == "error" else issues.warn)(key_path, message)
            continue
        if name in skip or value is None:  # null means "not set": the default applies
            continue
        ok, normalised = _check_value(key, value, key_path, issues)
        if ok:
            result[name] = normalised
    for key in table:
        if key.name in skip:
            continue
        if key.name not in result and key.required and values.get(key.name) is None:
            issues.error(_join(path, key.name), f"{_join(path, key.name)} is missing; "
                         f"{what} needs it ({key.meaning})")
        result.setdefault(key.name, key.default)
    return result


def _mapping_at(value: Any, path: str, issues: Issues, example: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    issues.error(path, f"{path} is {value!r}; use a mapping of keys to values, e.g. {example}")
    return {}


def _build_backend(name: str, entry: Any, mt: Mapping[str, Any], issues: Issues) -> BackendConfig | None:
    path = f"model_training.backends.{name}"
    if not isinstance(entry, dict):
        _mapping_at(entry, path, issues, "type: ssh and host: gpu.example.org")
        return None
    type_ = entry.get("type")
    types = configurable_types()
    if name == "local":
        if type_ not in (None, LOCAL.name):
            issues.error(f"{path}.type", f"{path}.type is {type_!r}; the name local is reserved for "
                         "the built-in backend on this machine; give this backend another name")
            return None
        type_ = LOCAL.name
    elif type_ is None:
        issues.error(f"{path}.type", f"{path}.type is missing; use one of: {', '.join(types)}")
        return None
    elif type_ not in types:
        issues.error(f"{path}.type", f"{path}.type is {type_!r}; use one of: "
                     f"{', '.join(types)}{did_you_mean(type_, types)}")
        return None
    if not _BACKEND_NAME.fullmatch(name):
        issues.error(path, f"model_training.backends has a backend named {name!r}; a name may hold "
                     "letters, digits, '.', '_' and '-', and starts with a letter or digit")
    declared = backend_type(type_)
    options = _check_table(declared.keys, entry, path, declared.what, issues, unsupported=declared.unsupported)
    options.pop("type", None)
    # Per-backend settings whose default is model_training's own.
    for key in declared.inherited:
        if key in options and options[key] is None:
            options[key] = mt.get(key)
    _check_backend_rules(options, path, issues)
    if declared.rules is not None:
        declared.rules(options, path, issues)
    return BackendConfig(name=name, type=type_, options=options)


_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")


def _find_control_character(path: str, value: Any) -> tuple[str, str] | None:
    """(path, string) of the first string at or inside *value* holding a control character, or None."""
    if isinstance(value, str):
        return (path, value) if _CONTROL_CHARACTER.search(value) else None
    if isinstance(value, dict):
        parts = [(f"{path} (a name)", k) for k in value] + [(f"{path}.{k}", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        parts = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for part_path, part in parts:
        found = _find_control_character(part_path, part)
        if found:
            return found
    return None


def _check_backend_rules(options: Mapping[str, Any], path: str, issues: Issues) -> None:
    """Rules beyond one key's type that hold for every backend type."""
    for key, value in options.items():
        # Every key but the menu's description reaches an ssh/sbatch command line,
        # job.sh or the remote environment, where a newline starts a command of its own.
        found = _find_control_character(f"{path}.{key}", value) if key != "description" else None
        if found:
            issues.error(f"{path}.{key}", f"{found[0]} is {found[1]!r}; it holds a control character, which "
                         "would break the command line or job.sh it goes into; remove it")
    host = options.get("host")
    if host == "":
        issues.error(f"{path}.host", f"{path}.host is ''; use the host's name (any name `ssh` accepts)")
    if isinstance(host, str) and host.startswith("-"):
        issues.error(f"{path}.host", f"{path}.host is {host!r}; a host may not start with '-' "
                     "(ssh would read it as an option); use the host's name")


def _check_backend_ref(value: Any, path: str, names: list[str], issues: Issues) -> None:
    # A non-string already has its type error; one message per mistake.
    if isinstance(value, str) and value not in names:
        issues.error(path, f"{path} is {value!r}, which names no backend; the backends are: "
                     f"{', '.join(names)}{did_you_mean(value, names)}")


def _check_trainers(trainers: Mapping[str, Any], issues: Issues) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for name, options in trainers.items():
        path = f"model_training.trainers.{name}"
        if name not in TRAINERS:
            issues.error(path, f"{path}: there is no trainer {name!r}{did_you_mean(name, TRAINERS, '.')} "
                         f"Trainers: {', '.join(TRAINERS)}")
            continue
        options = _mapping_at(options, path, issues, "epochs: 2")
        _check_trainer_options(name, options, path, issues)
        result[name] = dict(options)
    return result


def _check_trainer_options(trainer: str, options: Mapping[str, Any], path: str, issues: Issues) -> None:
    """The trainer module's own option checks, when it has them (it imports its ML packages lazily)."""
    for problem in check_trainer_options(trainer, options):
        issues.error(path, f"{path}: {problem}")


def _build_schemes(raw: Any, issues: Issues, positions: tuple[str, ...]) -> tuple[Scheme, ...]:
    from potato.scheme_fields import scheme_fields

    if raw is None:
        return ()
    if not isinstance(raw, list):
        issues.error("annotation_schemes", f"annotation_schemes is {raw!r}; use a list of schemes")
        return ()
    schemes = []
    for i, entry in enumerate(raw):
        path = f"annotation_schemes[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            issues.error(f"{path}.name", f"{path} has no name; give each scheme a name (a string)")
            continue
        labels = []
        # Real Potato allows a label as a string or as a mapping with a name.
        for label in entry.get("labels") or []:
            labels.append(str(label.get("name")) if isinstance(label, dict) else str(label))
        fields, problems = scheme_fields(entry, tuple(labels), positions)
        for key, problem in problems:
            issues.error(f"{path}.{key}", f"{path}.{key} (scheme {entry['name']!r}) {problem}")
        schemes.append(Scheme(**{
            "name": entry["name"],
            "annotation_type": str(entry.get("annotation_type") or ""),
            "labels": tuple(labels),
            "description": str(entry.get("description") or ""),
            **fields,
        }))
    return tuple(schemes)


def _check_bws_schemes(schemes: tuple[Scheme, ...], raw: Mapping[str, Any], bws: BwsConfig | None,
                       issues: Issues) -> None:
    """A bws schema needs the tuples ``bws_config`` builds (2.12.1 refuses to start without them too);
    with ``bws_config`` every item is a tuple, so a schema of another type has nothing of its own to answer."""
    bws_names = [s.name for s in schemes if s.annotation_type.strip().lower() == "bws"]
    if bws_names and bws is None and raw.get("bws_config") is None and raw.get("ibws_config") is None:
        issues.error("bws_config", f"schema {bws_names[0]!r} is a bws schema, and the config has no top-level "
                                   f"bws_config, which builds the tuples it shows; add bws_config: "
                                   f"{{tuple_size: 4}}")
    if bws is not None:
        for i, scheme in enumerate(schemes):
            if scheme.annotation_type.strip().lower() not in ("bws", ""):
                issues.warn(f"annotation_schemes[{i}]", f"annotation_schemes[{i}] (scheme {scheme.name!r}) is "
                            f"a {scheme.annotation_type} schema beside bws_config: Potato 2.12 shows only tuples "
                            f"then, so its answers are about a tuple, not an item, and train as such")


def _check_schema_names(names: Any, path: str, scheme_names: list[str], issues: Issues) -> None:
    for i, name in enumerate(names or ()):
        if name not in scheme_names:
            p = f"{path}[{i}]"
            have = ", ".join(scheme_names) or "none"
            issues.error(p, f"{p} is {name!r}, which is not a schema in annotation_schemes "
                         f"(it has: {have}){did_you_mean(name, scheme_names)}")


def _build_auto_retrain(ar_raw: Mapping[str, Any], scheme_names: list[str], backends: list[str],
                        issues: Issues) -> AutoRetrainConfig:
    """``model_training.auto_retrain``: checked as the server would use it, so a bad block stops it at start."""
    path = "model_training.auto_retrain"
    ar = _check_table(AUTO_RETRAIN_KEYS, ar_raw, path, path, issues, unknown="warn")
    _check_schema_names(ar["schemas"], f"{path}.schemas", scheme_names, issues)
    _check_backend_ref(ar_raw.get("backend"), f"{path}.backend", backends, issues)
    trainer = ar["trainer"]
    if isinstance(ar_raw.get("trainer"), str) and trainer not in TRAINERS:
        issues.error(f"{path}.trainer", f"{path}.trainer is {trainer!r}{did_you_mean(trainer, TRAINERS)}; this "
                     f"project's trainers are: {', '.join(TRAINERS)}")
    elif trainer in TRAINERS:
        _check_trainer_options(trainer, ar["params"], f"{path}.params", issues)
    if ar["enabled"] and not ar["schemas"]:
        issues.error(f"{path}.schemas", f"{path}.schemas is missing; auto-retraining needs the schemas "
                     f"to train, e.g. schemas: [{(scheme_names or ['sentiment'])[0]}]")
    return AutoRetrainConfig(
        enabled=ar["enabled"], trainer=trainer, schemas=tuple(ar["schemas"] or ()),
        update_frequency=ar["update_frequency"], min_interval_s=ar["min_interval_s"],
        params=dict(ar["params"] or {}), backend=ar["backend"],
    )


def _check_trainable(schemes: tuple[Scheme, ...], writeback_schemas: Any, auto_retrain: AutoRetrainConfig,
                     issues: Issues) -> None:
    """Each schema of ``writeback.schemas`` has a trainer, and auto-retraining's trainer(s) train each
    of its schemas: otherwise every such run would be refused (``potato.trainer_choice``)."""
    from potato.trainer_choice import NoTrainerFor, plan_trainers

    by_name = {s.name: s for s in schemes}
    for i, name in enumerate(writeback_schemas):
        if name in by_name and by_name[name].kind == BEST_WORST:
            path = f"model_training.writeback.schemas[{i}]"
            issues.error(path, f"{path} is {name!r}, a bws schema: Potato 2.12 builds its tuples when it starts "
                               f"and keeps them in no data file, so no prediction can reach one; its predictions "
                               f"stay in the run's predictions.jsonl and on its run page; remove it from "
                               f"writeback.schemas")
        elif name in by_name and by_name[name].kind in ORDER_ONLY_KINDS:
            continue  # written as a confidence only, for model_review (_check_comparisons_written_back)
        elif name in by_name:
            try:
                plan_trainers([by_name[name]])
            except NoTrainerFor as exc:
                path = f"model_training.writeback.schemas[{i}]"
                issues.error(path, f"{path} is {name!r}: {exc}")
    if auto_retrain.trainer is not None and auto_retrain.trainer not in TRAINERS:
        return  # named as unknown already
    path = "model_training.auto_retrain"
    defaults: dict[str, None] = {}
    for i, name in enumerate(auto_retrain.schemas):
        if name not in by_name:
            continue
        try:
            defaults.update(dict.fromkeys(plan_trainers([by_name[name]], auto_retrain.trainer)))
        except NoTrainerFor as exc:
            where = f"{path}.trainer" if auto_retrain.trainer else f"{path}.schemas[{i}]"
            shown = auto_retrain.trainer if auto_retrain.trainer else name
            issues.error(where, f"{where} is {shown!r}: {exc}")
    if auto_retrain.trainer is None:  # a named trainer's params are checked where it is read
        for trainer in defaults:
            _check_trainer_options(trainer, auto_retrain.params, f"{path}.params", issues)


def _check_auto_retrain_backend(auto_retrain: AutoRetrainConfig, default: Any,
                                backends: Mapping[str, BackendConfig], issues: Issues) -> None:
    """A local-only trainer (decision-calibrate) cannot auto-retrain elsewhere: every queued run would be refused."""
    info = TRAINERS.get(auto_retrain.trainer)
    name = auto_retrain.backend or (default if isinstance(default, str) else None) or "local"
    backend = backends.get(name)
    if info is not None and info.local_only and backend is not None and not backend.type_info.on_this_machine:
        path = "model_training.auto_retrain"
        issues.error(f"{path}.trainer", f"{path}.trainer is {auto_retrain.trainer!r}, which runs only on the "
                     f"local backend, but auto-retraining would run it on {name!r} ({backend.type}); set "
                     f"{path}.backend: local")


def _build_model_training(raw: Any, schemes: tuple[Scheme, ...], debug: bool,
                          issues: Issues) -> ModelTrainingConfig:
    path = "model_training"
    mt_raw = _mapping_at(raw, path, issues, "enabled: true")
    # Unknown keys directly under model_training only warn: a key a newer
    # Potato reads should not stop an older one.
    mt = _check_table(MODEL_TRAINING_KEYS, mt_raw, path, "model_training", issues,
                      unknown="warn", skip=("writeback", "auto_retrain", "backends", "trainers"))
    if isinstance(mt["holdout_fraction"], (int, float)) and mt["holdout_fraction"] >= 1:
        issues.error(f"{path}.holdout_fraction", f"{path}.holdout_fraction is {mt['holdout_fraction']!r}: every "
                     "labelled item would be held out, leaving nothing to train on; use a value below 1 (0 trains "
                     "on every label)")
    if mt_raw.get("holdout_fraction") is not None and (
            mt_raw.get("splits") is not None or mt_raw.get("split_seed") is not None):
        issues.error(f"{path}.holdout_fraction", f"{path}.holdout_fraction and {path}.splits/split_seed "
                     "both decide which items are held out; keep one (splits and split_seed are "
                     "Potato 2.12's, holdout_fraction this project's)")

    wb_raw = _mapping_at(mt_raw.get("writeback"), f"{path}.writeback", issues, 'schemas: ["sentiment"]')
    wb = _check_table(WRITEBACK_KEYS, wb_raw, f"{path}.writeback", "model_training.writeback",
                      issues, unknown="warn")
    scheme_names = [s.name for s in schemes]
    _check_schema_names(wb["schemas"], f"{path}.writeback.schemas", scheme_names, issues)
    if isinstance(wb["order"], str) and wb["order"] not in STRATEGIES:
        issues.error(f"{path}.writeback.order", f"{path}.writeback.order is {wb['order']!r}, not an order"
                     f"{did_you_mean(wb['order'], STRATEGIES, '.')} Orders: {', '.join(STRATEGIES)}")
    for k, name in enumerate(mt["report_to"] or ()):
        if name not in TRACKERS:
            why = ("a tracker this project does not report to yet." if name in TRACKERS_NOT_HERE
                   else "not a tracker" + did_you_mean(name, TRACKERS, "."))
            issues.error(f"{path}.report_to[{k}]", f"{path}.report_to names {name!r}, {why} "
                         f"Trackers: {', '.join(TRACKERS)}")
    if wb["field"] in ("", "id", "instance_id"):
        issues.error(f"{path}.writeback.field", f"{path}.writeback.field is {wb['field']!r}; each record "
                     "names its item under id, so use another key, e.g. predictions")

    backends: dict[str, BackendConfig] = {}
    backends_raw = _mapping_at(mt_raw.get("backends"), f"{path}.backends", issues,
                               "gpu-server: {type: ssh, host: gpu.example.org}")
    names = ["local"] + [str(n) for n in backends_raw if n != "local"]
    if "local" not in backends_raw:
        backends["local"] = _build_backend("local", {}, mt, issues)
    for name, entry in backends_raw.items():
        backend = _build_backend(str(name), entry, mt, issues)
        if backend is not None:
            backends[str(name)] = backend
    backends = {"local": backends.pop("local", LOCAL_BACKEND), **backends}

    _check_backend_ref(mt_raw.get("backend"), f"{path}.backend", names, issues)
    ar_raw = _mapping_at(mt_raw.get("auto_retrain"), f"{path}.auto_retrain", issues, "enabled: true")
    auto_retrain = _build_auto_retrain(ar_raw, scheme_names, names, issues)
    _check_auto_retrain_backend(auto_retrain, mt_raw.get("backend"), backends, issues)
    _check_trainable(schemes, wb["schemas"] or (), auto_retrain, issues)
    if mt["enabled"] and auto_retrain.enabled:
        # Potato 2.12 retrains by itself when both are true (its training/manager.py).
        issues.warn(f"{path}.enabled", f"{path}.enabled and {path}.auto_retrain.enabled are both true: "
                    "a Potato 2.12 server reading this config would also retrain on its own, on the same "
                    f"annotations as this project's potato start; set {path}.enabled: false (this project "
                    "trains either way)")

    over_ssh = sorted(b.name for b in backends.values() if b.type_info.over_ssh)
    if debug and over_ssh:
        # Requests through an ssh run's forwarded socket arrive from loopback, which debug makes admin.
        issues.warn("debug", f"debug is true and backend(s) {', '.join(over_ssh)} train over ssh: with debug on, "
                    "this server grants admin rights to every loopback request, and requests through an ssh "
                    "run's forwarded socket arrive from loopback. Set debug: false in the config on a server "
                    "that trains over ssh")

    trainers_raw = _mapping_at(mt_raw.get("trainers"), f"{path}.trainers", issues,
                               "hf-text-classification: {epochs: 2}")
    trainers = _check_trainers(trainers_raw, issues)

    split_set = mt["splits"] is not None or mt["split_seed"] is not None
    return ModelTrainingConfig(
        enabled=mt["enabled"],
        backend=mt["backend"] if mt["backend"] in names else "local",
        max_wall_seconds=mt["max_wall_seconds"],
        grace_seconds=mt["grace_seconds"],
        heartbeat_timeout_s=mt["heartbeat_timeout_s"],
        device=mt["device"],
        num_threads=mt["num_threads"],
        max_ram_mb=mt["max_ram_mb"],
        max_predictions_mb=mt["max_predictions_mb"],
        holdout_fraction=mt["holdout_fraction"],
        splits=(mt["splits"] or dict(DEFAULT_SPLITS)) if split_set else None,
        split_seed=(mt["split_seed"] or 0) if split_set else None,
        aggregation=mt["aggregation"],
        retain_runs=mt["retain_runs"],
        stable_below=mt["stable_below"],
        writeback=WritebackConfig(
            schemas=tuple(wb["schemas"] or ()),
            include_unlabeled=wb["include_unlabeled"],
            min_confidence=wb["min_confidence"],
            field=wb["field"],
            live=wb["live"],
            order=wb["order"] if wb["order"] in STRATEGIES else DEFAULT_STRATEGY,
            order_batch=wb["order_batch"],
            gate=wb["gate"],
            gate_confidence=wb["gate_confidence"],
            min_holdout=wb["min_holdout"],
        ),
        auto_retrain=auto_retrain,
        trainers=trainers,
        prefect_deployment=mt["prefect_deployment"],
        license=mt["license"],
        report_to=tuple(dict.fromkeys(n for n in mt["report_to"] or () if n in TRACKERS)),
        backends=backends,
    )


# ---------------------------------------------------------------------------
# Where items come from, and where Potato 2.12 looks for our predictions
# ---------------------------------------------------------------------------

# What Potato 2.12's data_directory loader reads (its directory_watcher.py):
# these extensions, lower case, directly in the directory, hidden files excluded.
DATA_DIRECTORY_EXTENSIONS = (".json", ".jsonl", ".csv", ".tsv")


def data_directory_files(directory: Path) -> list[Path]:
    """The files of *directory* that Potato 2.12 loads items from, in its order (sorted paths)."""
    # pathlib's glob matches dot files; glob.glob, which 2.12 uses, does not.
    return sorted(p for ext in DATA_DIRECTORY_EXTENSIONS for p in directory.glob(f"*{ext}")
                  if p.is_file() and not p.name.startswith("."))


def _check_encoding(value: Any, path: str, issues: Issues) -> str:
    try:
        if isinstance(value, str):
            name = codecs.lookup(value).name
            # base64, hex, rot13, zlib…: codecs Python knows, but they turn bytes into bytes (or text
            # into text); str.encode refuses them, as reading the file with one would.
            "".encode(name)
            return name
    except LookupError:
        pass
    except UnicodeError:  # the 'undefined' codec: it refuses every text
        pass
    issues.error(path, f"{path} is {value!r}, which is not a text encoding Python knows; use e.g. "
                 "utf-8 or latin-1")
    return "utf-8"


def _build_data_files(entries: Any, task_dir: Path, issues: Issues) -> tuple[tuple[Path, ...], dict]:
    """``data_files``: paths, or Potato 2.12's ``{path, encoding, filter_by_prior_annotation}`` entries."""
    if entries is None:
        return (), {}
    if not isinstance(entries, list):
        issues.error("data_files", f"data_files is {entries!r}; use a list of files, e.g. [data/items.jsonl]")
        return (), {}
    files, encodings = [], {}
    for i, entry in enumerate(entries):
        path = f"data_files[{i}]"
        name, encoding = entry, None
        if isinstance(entry, dict):
            name, encoding = entry.get("path"), entry.get("encoding")
            path = f"{path}.path"
        if not isinstance(name, str) or not name:
            issues.error(path, f"{path} is {name!r}; name a data file (a path relative to task_dir)")
            continue
        file = task_dir / Path(name).expanduser()
        if file.suffix.lower() == ".parquet":
            # 2.12 reads Parquet only with its optional [export] extra (pyarrow).
            issues.error(path, f"{path} is {name!r}, a Parquet file, which this feature cannot read; "
                         "convert it to JSON lines (e.g. pandas.read_parquet(f).to_json(out, "
                         "orient='records', lines=True)) and list that file instead")
            continue
        if not file.is_file():
            issues.error(path, f"{path} is {name!r}, which does not exist (looked for {str(file)!r}); "
                         "data_files are relative to task_dir")
            continue
        if encoding is not None:
            encodings[file] = _check_encoding(encoding, f"data_files[{i}].encoding", issues)
        files.append(file)
    return tuple(files), encodings


def _build_item_sources(raw: Mapping[str, Any], task_dir: Path, issues: Issues) -> dict[str, Any]:
    """``data_files`` and ``data_directory`` as ProjectConfig fields; a source we cannot read is an error.

    A project whose items or labels this feature cannot read must fail here,
    by name, rather than train on an empty bundle.
    """
    files, encodings = _build_data_files(raw.get("data_files"), task_dir, issues)
    fields: dict[str, Any] = {"data_files": files, "data_file_encodings": encodings}
    directory = raw.get("data_directory")
    if directory is not None:
        if not isinstance(directory, str) or not directory.strip():
            issues.error("data_directory", f"data_directory is {directory!r}; name a directory of data "
                         "files (relative to task_dir)")
        else:
            where = task_dir / Path(directory).expanduser()
            if not where.is_dir():
                issues.error("data_directory", f"data_directory is {directory!r}, which is not a directory "
                             f"(looked for {str(where)!r}); it is relative to task_dir")
            elif not data_directory_files(where) and not raw.get("watch_data_directory"):
                issues.warn("data_directory", f"data_directory {directory!r} holds no "
                            f"{', '.join(DATA_DIRECTORY_EXTENSIONS)} files, so runs have no items")
            fields["data_directory"] = where
            fields["data_directory_encoding"] = _check_encoding(
                raw.get("data_directory_encoding", "utf-8"), "data_directory_encoding", issues)
    if raw.get("data_sources"):
        issues.error("data_sources", "data_sources is set, and this feature does not read data_sources "
                     "(URLs, cloud storage, databases); list the items' files under data_files or put "
                     "them in a data_directory")
    groups = (raw.get("batch_assignment") or {}).get("groups") if isinstance(raw.get("batch_assignment"), dict) else None
    if isinstance(groups, list) and any(isinstance(g, dict) and (g.get("data_file") or g.get(
            "input_data_file") or g.get("input_file")) for g in groups):
        issues.error("batch_assignment.groups", "batch_assignment.groups name data files, which this "
                     "feature does not read; list those files under data_files too")
    database = raw.get("database")
    if isinstance(database, dict) and database.get("type") == "mysql":
        # 2.12 then keeps every annotator's user_state.json in MySQL
        # (table user_state_documents), not in output_annotation_dir.
        issues.error("database", "database.type is 'mysql': the annotators' labels are in that database "
                     "(table user_state_documents), and this feature reads labels only from "
                     "<output_annotation_dir>/<user>/user_state.json; use Potato's default file "
                     "storage (remove the database block) to train on this project")
    if not raw.get("data_files") and directory is None and not raw.get("data_sources"):
        issues.error("data_files", "data_files is missing; list the items' files under data_files (or "
                     "name a data_directory), relative to task_dir")
    return fields


def assignment_strategy(raw: Mapping[str, Any]) -> str | None:
    """The ``assignment_strategy`` Potato 2.12 serves items by (a name, or ``{name: …}``), None when unset."""
    strategy = raw.get("assignment_strategy")
    if isinstance(strategy, dict):
        strategy = strategy.get("name")
    return strategy if isinstance(strategy, str) else None


# Potato 2.12's strategy that serves items by the confidence in their own data, least first.
MODEL_REVIEW = "model_review"
# Potato 2.12's directory watcher's default and bounds for watch_poll_interval (seconds).
WATCH_POLL_DEFAULT, WATCH_POLL_RANGE = 5.0, (1.0, 3600.0)


def watch_poll_interval(raw: Mapping[str, Any]) -> float:
    """How often Potato 2.12 looks at the watched data_directory (as it reads ``watch_poll_interval``)."""
    value = raw.get("watch_poll_interval", WATCH_POLL_DEFAULT)
    if not _is_number(value):
        return WATCH_POLL_DEFAULT
    return min(max(float(value), WATCH_POLL_RANGE[0]), WATCH_POLL_RANGE[1])


def _prefills_from_item_data(raw: Mapping[str, Any]) -> bool:
    """Whether Potato 2.12 pre-fills answers from item data (its ``QualityControlManager``: with
    ``pre_annotation.enabled``, or its own training's writeback, under ``writeback.field``)."""
    pre = raw.get("pre_annotation") if isinstance(raw.get("pre_annotation"), dict) else {}
    training = raw.get("model_training") if isinstance(raw.get("model_training"), dict) else {}
    writeback = training.get("writeback") if isinstance(training.get("writeback"), dict) else {}
    return bool(pre.get("enabled") or (training.get("enabled") and writeback.get("schemas")))


def _check_pre_annotation(raw: Mapping[str, Any], task_dir: Path, output_dir: Path,
                          writeback: WritebackConfig, issues: Issues, *, data_files: bool) -> None:
    """Warn when Potato 2.12's ``pre_annotation`` block would not show our written-back predictions."""
    pre = raw.get("pre_annotation")
    if not isinstance(pre, dict) or not pre.get("enabled") or not writeback.schemas:
        return
    ours = output_dir / TRAINING_DIR / WRITEBACK_FILE
    named = pre.get("predictions_file")
    is_ours = isinstance(named, str) and (task_dir / named).resolve() == ours.resolve()
    if writeback.live:
        # The items' own records carry their predictions; the file is for items they cannot hold.
        needed = data_files or any(p.suffix.lower() in (".csv", ".tsv") for p in _directory_files(raw, task_dir))
        if is_ours and not needed:
            issues.warn("pre_annotation.predictions_file", "pre_annotation.predictions_file is read by Potato "
                        "2.12 once, at its start, and with model_training.writeback.live the items' own records "
                        "hold their predictions: once a run or a retract takes an item's prediction away, 2.12 "
                        "would show the one that file held at its start instead. Remove predictions_file")
    elif not is_ours:
        issues.warn("pre_annotation.predictions_file", f"pre_annotation.predictions_file is {named!r}, but "
                    f"this project writes its predictions to {os.path.relpath(ours, task_dir)!r}; point "
                    "predictions_file there (relative to task_dir) so that Potato 2.12 shows them")
    field_name = pre.get("field", "predictions")
    if field_name != writeback.field:
        issues.warn("pre_annotation.field", f"pre_annotation.field is {field_name!r} and "
                    f"model_training.writeback.field is {writeback.field!r}; Potato 2.12 reads "
                    "predictions under pre_annotation.field, so make the two the same")


def _directory_files(raw: Mapping[str, Any], task_dir: Path) -> list[Path]:
    directory = raw.get("data_directory")
    where = task_dir / Path(directory).expanduser() if isinstance(directory, str) and directory.strip() else None
    return data_directory_files(where) if where is not None and where.is_dir() else []


def _check_live(raw: Mapping[str, Any], writeback: WritebackConfig, sources: Mapping[str, Any],
                issues: Issues) -> None:
    """What Potato 2.12 needs to show the live writeback's predictions, and to serve by them under model_review."""
    path = "model_training.writeback.live"
    if writeback.live and writeback.schemas:
        if sources.get("data_directory") is None:
            issues.error(path, f"{path} is true, but no item comes from a data_directory: Potato 2.12 changes "
                         "a running item's data only for items of a watched data_directory. Move the items' files "
                         "into a directory and set data_directory and watch_data_directory: true, or set live: "
                         "false (annotators then see a new model after Potato 2.12 restarts)")
            return
        if raw.get("watch_data_directory") is not True:
            issues.warn("watch_data_directory", f"{path} is true, but watch_data_directory is not: Potato 2.12 "
                        "then reads data_directory only when it starts, so predictions reach annotators only "
                        "after a restart; set watch_data_directory: true")
        if not _prefills_from_item_data(raw):
            issues.warn("pre_annotation.enabled", f"{path} is true, but pre_annotation.enabled is not: Potato "
                        "2.12 pre-fills nothing from the items' data; set pre_annotation.enabled: true")
        encoding = sources.get("data_directory_encoding", "utf-8")
        from potato.json_records import ascii_safe

        if not ascii_safe(encoding):
            issues.warn("data_directory_encoding", f"data_directory_encoding is {encoding!r}, in which the live "
                        "writeback cannot change one field of a record and leave every other byte as it is, so "
                        "it changes nothing; save the data files as UTF-8")
    if assignment_strategy(raw) == MODEL_REVIEW and writeback.schemas:
        if not writeback.live:
            issues.warn("assignment_strategy", "assignment_strategy is model_review: Potato 2.12 then serves "
                        "only items whose own data holds a prediction, and never reads "
                        f"pre_annotation.predictions_file for it; set {path}: true (with a watched "
                        "data_directory) so that annotators are served the items the model is least sure of first")
        if not writeback.include_unlabeled:
            issues.warn("model_training.writeback.include_unlabeled", "assignment_strategy is model_review and "
                        "model_training.writeback.include_unlabeled is false: Potato 2.12 serves only items that "
                        "hold a prediction, so items nobody has labelled are never served; set "
                        "include_unlabeled: true")


def _check_comparisons_written_back(raw: Mapping[str, Any], schemes: tuple[Scheme, ...],
                                   writeback: WritebackConfig, issues: Issues) -> None:
    """A pairwise or ranking schema is written back as its confidence only, which Potato 2.12 uses for one
    thing: serving the items under model_review, least sure first. Under any other strategy it would change
    nothing annotators see (potato.prefill.writeback_shapes)."""
    if assignment_strategy(raw) == MODEL_REVIEW:
        return
    by_name = {s.name: s for s in schemes}
    for i, name in enumerate(writeback.schemas):
        if name in by_name and by_name[name].kind in ORDER_ONLY_KINDS:
            path = f"model_training.writeback.schemas[{i}]"
            issues.error(path, f"{path} is {name!r}, a {by_name[name].annotation_type} schema: Potato 2.12 "
                               f"pre-fills nothing for one, so writing it back only orders the items, and only "
                               f"under assignment_strategy: model_review (the comparisons the model is least sure "
                               f"of first); set assignment_strategy: model_review, or remove it from "
                               f"writeback.schemas (its predictions stay in the run's predictions.jsonl and on "
                               f"its run page)")


def describe_live(config: ProjectConfig) -> str | None:
    """``potato validate``'s line on where annotators see predictions, for a project that writes some back."""
    wb = config.model_training.writeback
    if not wb.schemas or config.data_directory is None:
        return None
    shown = os.path.relpath(config.data_directory, config.task_dir)
    if not wb.live:
        if config.raw.get("watch_data_directory") is not True:
            return None
        return (f"Live writeback: off. Annotators see a new run's predictions after Potato 2.12 restarts; with "
                f"model_training.writeback.live: true they go into the items' own records in {shown}/ and "
                "show within watch_poll_interval")
    line = (f"Live writeback: on. Each run's predictions go into the field {wb.field!r} of the items' own "
            f"records in {shown}/ (.json and .jsonl files; nothing else in them changes), and Potato 2.12 "
            f"shows them within {watch_poll_interval(config.raw):g} s (watch_poll_interval)")
    if assignment_strategy(config.raw) == MODEL_REVIEW:
        line += (f"; under assignment_strategy: model_review Potato 2.12 serves the items in the order {wb.order!r} "
                 "ranks them, and an item below min_confidence holds its confidence only, pre-filling nothing")
    return line


def _check_training_user(task_dir: Path, output_dir: Path, issues: Issues) -> None:
    """Warn when Potato 2.12 let an annotator sign in as ``training``: their files land beside the run store."""
    state = output_dir / TRAINING_DIR / "user_state.json"
    if state.is_file():
        shown = os.path.relpath(state, task_dir)
        issues.warn("output_annotation_dir", f"{shown} exists: an annotator signed in to Potato 2.12 as "
                    f"{TRAINING_DIR!r}, the directory where this project keeps its run store and runs. Their "
                    "labels are never read for training; give the annotator another user name (move that "
                    "directory's user_state.json and annotation_history.jsonl to a directory named after it)")


# Top-level keys this feature reads: name -> (kind, default). Others are ignored.
_TOP_LEVEL: Mapping[str, tuple[str, Any]] = {
    "annotation_task_name": ("str", ""),
    "task_dir": ("str", "."),
    "output_annotation_dir": ("str", "annotation_output"),
    "debug": ("bool", False),
}


# Keys that examples and tutorials ship with: a server that keeps one is open to anyone who read them.
PLACEHOLDER_ADMIN_KEYS = frozenset({"change-me", "changeme"})


def build_config(raw: Mapping[str, Any], path: str | Path) -> BuildResult:
    """Check and type the parsed config *raw* read from *path*; collect every issue."""
    issues = Issues()
    path = Path(path).absolute()
    top = {}
    for name, (kind, default) in _TOP_LEVEL.items():
        top[name] = default
        if raw.get(name) is not None:
            ok, value = _check_value(Key(name, kind, ""), raw[name], name, issues)
            if ok:
                top[name] = value

    admin_api_key = raw.get("admin_api_key")
    if admin_api_key is not None and not isinstance(admin_api_key, (str, int)):
        issues.error("admin_api_key", f"admin_api_key is {admin_api_key!r}; use a string")
        admin_api_key = None
    elif str(admin_api_key).strip().lower() in PLACEHOLDER_ADMIN_KEYS:
        issues.warn("admin_api_key", f"admin_api_key is {admin_api_key!r}, the example's placeholder: anyone "
                    "who has read the example can log in to the Training page and start, cancel, retract and "
                    "publish runs. Set a secret of your own, e.g. the output of: "
                    "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")

    task_dir = (path.parent / Path(top["task_dir"]).expanduser()).resolve()
    sources = _build_item_sources(raw, task_dir, issues)
    output_dir = task_dir / Path(top["output_annotation_dir"]).expanduser()

    props = _mapping_at(raw.get("item_properties"), "item_properties", issues, 'id_key: "id"')
    keys = {}
    for name, default in (("id_key", "id"), ("text_key", "text")):
        keys[name] = default
        if props.get(name) is not None:
            ok, value = _check_value(Key(name, "str", ""), props[name], f"item_properties.{name}", issues)
            if ok:
                keys[name] = value

    bws, problems = read_bws_config(raw.get("bws_config"))
    for key, problem in problems:
        where = ".".join(filter(None, ("bws_config", key)))
        issues.error(where, f"{where} {problem}")
    schemes = _build_schemes(raw.get("annotation_schemes"), issues, bws.positions if bws else ())
    _check_bws_schemes(schemes, raw, bws, issues)
    model_training = _build_model_training(raw.get("model_training"), schemes, top["debug"], issues)
    _check_pre_annotation(raw, task_dir, output_dir, model_training.writeback, issues,
                          data_files=bool(sources["data_files"]))
    _check_live(raw, model_training.writeback, sources, issues)
    _check_comparisons_written_back(raw, schemes, model_training.writeback, issues)
    _check_training_user(task_dir, output_dir, issues)

    warnings = tuple(issues.warnings)
    config = None
    if not issues.errors:
        config = ProjectConfig(
            path=path,
            task_dir=task_dir,
            **sources,
            id_key=keys["id_key"],
            text_key=keys["text_key"],
            output_annotation_dir=output_dir,
            admin_api_key=None if admin_api_key is None else str(admin_api_key),
            schemes=schemes,
            model_training=model_training,
            debug=top["debug"],
            annotation_task_name=top["annotation_task_name"],
            raw=raw,
            warnings=warnings,
            bws=bws,
        )
    return BuildResult(config=config, errors=tuple(issues.errors), warnings=warnings)


def format_errors(path: str | Path, errors: tuple[Issue, ...]) -> str:
    """The ``ConfigError`` text: the file, then one line per error."""
    noun = "error" if len(errors) == 1 else "errors"
    lines = [f"{Path(path).absolute()} has {len(errors)} {noun}:"]
    lines += [f"  - {e.message}" for e in errors]
    return "\n".join(lines)


def load_config(path: str | Path) -> ProjectConfig:
    """Read, validate and type the config at *path*; raise ``ConfigError`` if invalid.

    The error's message lists every error; ``exc.issues`` holds them as ``Issue``s.
    Warnings are in the returned config's ``warnings``.
    """
    raw, errors = read_config_file(path)
    result = build_config(raw, path) if raw is not None else BuildResult(None, errors, ())
    if result.config is None:
        exc = ConfigError(format_errors(path, result.errors))
        exc.issues = result.errors
        raise exc
    return result.config


# ---------------------------------------------------------------------------
# docs/backends.md
# ---------------------------------------------------------------------------

DOCS_COMMAND = "python -m potato.config --docs > docs/backends.md"


def _render_table(table: tuple[Key, ...], prefix: str = "") -> list[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in table:
        lines.append(f"| `{prefix}{key.name}` | {key.doc_kind()} | {key.doc_default()} | {key.meaning} |")
    return lines


def render_backends_doc() -> str:
    """docs/backends.md, generated from the key tables."""
    out = [
        "# Backends and their keys",
        "",
        f"<!-- Generated from potato/config.py by `{DOCS_COMMAND}`; do not edit by hand. -->",
        "",
        "A backend is where a training run executes. `local` (this machine) always exists;",
        "others are named under `model_training.backends`, each with a `type`.",
        "`potato validate config.yaml` checks every key below; a key a type does not",
        "accept is an error. A key set to `null` takes its default.",
        "",
        "Value types: *`gpus` spec* is `auto`, `none`, `\"1\"` or `\"0,1\"`; *SLURM time* is",
        f"any form `sbatch --time` accepts: {SLURM_TIME_FORMS} (an int is minutes).",
        "",
        "## `model_training`",
        "",
        "Unknown keys here are warnings, not errors.",
        "",
        *_render_table(MODEL_TRAINING_KEYS),
        "",
        "### `model_training.writeback`",
        "",
        *_render_table(WRITEBACK_KEYS),
        "",
        "### `model_training.auto_retrain`",
        "",
        "`potato start` watches the annotators' files and queues a run (trigger `auto`) when all hold:",
        "`update_frequency` annotations were made since the last automatic run, `min_interval_s` have",
        "passed since the last run ended, and no run is queued or running. An unknown trainer or",
        "schema, or `enabled` without `schemas`, stops the server at start.",
        "",
        *_render_table(AUTO_RETRAIN_KEYS),
        "",
        "### Potato 2.12's keys",
        "",
        "Every `model_training` key that Potato 2.12.1's own training feature reads is accepted",
        "without a warning. What this project does with each:",
        "",
        "| key | here |",
        "|---|---|",
        *(f"| `{key}` | {meaning} |" for key, meaning in POTATO_212_KEYS),
        "",
        "Keys that only this project has: `backend`, `heartbeat_timeout_s`, `max_predictions_mb`,",
        "`holdout_fraction`, `backends`, `trainers`, `prefect_deployment`, `license`, `report_to`,",
        "`auto_retrain.backend`.",
        "Potato 2.12 ignores them with one warning each at its start.",
        "",
    ]
    for declared in BACKEND_TYPES.values():
        out += [f"## `type: {declared.name}`", "", " ".join(declared.doc.split()), "", *_render_table(declared.keys), ""]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--docs"]:
        sys.stdout.write(render_backends_doc())
    else:
        sys.exit(f"usage: {DOCS_COMMAND}")
