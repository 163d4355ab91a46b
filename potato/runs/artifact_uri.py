"""A run's ``artifact_uri``: where its model files are, written by the backends and read back here.

Three shapes, one per outcome of an ssh or slurm run's fetch step (an agent
run's is the agent machine's ``host:/dir``, which its backend type names):

- ``/srv/…/runs/7/artifacts`` — every file came back to this server;
- ``gpu.example.org:/home/me/.cache/potato-training/jobs/7/artifacts`` — none
  did (``fetch_artifacts: false``): the model stays on the host;
- ``/srv/…/runs/7/artifacts (and gpu.example.org:/…/jobs/7/artifacts)`` —
  some files stayed on the host (larger than ``max_artifact_mb``, or refused
  by the copy); the run log names them.

Building and reading both live here, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PARTLY = re.compile(r"^(?P<local>.*) \(and (?P<remote>[^()]*)\)$")


@dataclass(frozen=True)
class ArtifactPlace:
    """What an ``artifact_uri`` says: the local directory (if any) and what stayed on a host (if anything)."""

    local: str | None
    host: str | None
    remote_dir: str | None

    @property
    def all_on_host(self) -> bool:
        return self.host is not None and self.local is None


def on_host(host: str, remote_dir: str) -> str:
    """The uri of a model that stayed entirely on *host* in *remote_dir*."""
    return f"{host}:{remote_dir}"


def partly_on_host(local_dir: str, host: str, remote_dir: str) -> str:
    """The uri of a model copied to *local_dir* except files that stayed on *host* in *remote_dir*."""
    return f"{local_dir} (and {on_host(host, remote_dir)})"


def _split_remote(text: str) -> tuple[str, str]:
    host, _, path = text.partition(":")
    return host, path


def parse(uri: str | None) -> ArtifactPlace:
    """Read an ``artifact_uri`` written by ``on_host`` / ``partly_on_host`` / a plain local directory."""
    if not uri:
        return ArtifactPlace(None, None, None)
    partly = _PARTLY.match(uri)
    if partly:
        host, path = _split_remote(partly["remote"])
        return ArtifactPlace(partly["local"], host, path)
    if uri.startswith("/"):
        return ArtifactPlace(uri, None, None)
    host, path = _split_remote(uri)
    return ArtifactPlace(None, host, path) if path else ArtifactPlace(uri, None, None)
