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
  table, defaults applied), ``get(key)``, ``host``, ``describe()`` (the Runs on
  menu text, e.g. ``gpu-server (ssh to gpu.example.org)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Scheme:
    name: str
    annotation_type: str
    labels: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class WritebackConfig:
    schemas: tuple[str, ...] = ()
    include_unlabeled: bool = False
    min_confidence: float = 0.0


@dataclass(frozen=True)
class AutoRetrainConfig:
    enabled: bool = False
    backend: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


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

    def describe(self) -> str:
        """The Runs on menu's text for this backend (SPEC §3)."""
        if self.type == "local":
            return f"{self.name} (this machine)"
        if self.type == "ssh":
            return f"{self.name} (ssh to {self.host})"
        if self.type == "slurm":
            return f"{self.name} (slurm on {self.host})"
        return f"{self.name} ({self.type})"


LOCAL_BACKEND = BackendConfig(name="local", type="local", options={})


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
    writeback: WritebackConfig = field(default_factory=WritebackConfig)
    auto_retrain: AutoRetrainConfig = field(default_factory=AutoRetrainConfig)
    trainers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    backends: Mapping[str, BackendConfig] = field(
        default_factory=lambda: {"local": LOCAL_BACKEND}
    )


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

    @property
    def training_dir(self) -> Path:
        return self.output_annotation_dir / "training"

    def scheme(self, name: str) -> Scheme | None:
        return next((s for s in self.schemes if s.name == name), None)


def load_config(path: str | Path) -> ProjectConfig:
    """Read, validate and type the config at *path*; raise ``ConfigError`` if invalid."""
    raise NotImplementedError
