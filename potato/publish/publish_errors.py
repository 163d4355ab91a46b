"""Why a run's model is not published, each message built here once (with its fix).

Importable without I/O. The tree::

    PublishError                 anything publishing reports to its user
    ├── PublishRefused           refused before the Hub is asked (API 409, CLI exit 1)
    │   ├── RunNotSucceeded      the run has no model: it did not succeed
    │   ├── ModelOnHost          the model (or some of it) stayed on the ssh/slurm host
    │   ├── ModelOnAgent         an agent run: the model is on the agent's machine
    │   ├── ModelFilesMissing    the run's directory has no complete model
    │   ├── CalibrationNotKept   a decision-calibrate run that kept no calibration
    │   ├── BaseModelUnknown     a LoRA adapter whose base model has no Hub id Potato knows
    │   ├── NoHubToken           no Hugging Face token (HF_TOKEN, or `hf auth login`'s)
    │   ├── HubOffline           HF_HUB_OFFLINE is set: huggingface_hub reaches no Hub
    │   ├── PublishInProgress    the run is being published already
    │   └── BadPublishRequest    a repo name, revision, license or base model that is not valid (API 400)
    └── HubError                 the Hub said no, or could not be reached (the upload ran)
        ├── HubTokenRefused      401: the token is wrong, expired or revoked
        ├── HubForbidden         403: the repo or its namespace belongs to someone else
        ├── HubUnreachable       the connection failed (the Hub commits whole or not at all)
        ├── HubRefused           any other refusal, with the Hub's own words
        └── UploadFailed         anything else the upload raised (its text without credentials)
"""

from __future__ import annotations

import shlex

from potato.errors import PotatoError

HF_UPLOAD = "hf upload"  # huggingface_hub's own command, for publishing from another machine


class PublishError(PotatoError):
    """Raised when a run's model is not published; the message says why and what to do."""


class PublishRefused(PublishError):
    """Raised before anything is sent: the run, its files or the request do not allow it."""


class RunNotSucceeded(PublishRefused):
    def __init__(self, run_id: int, state: str):
        if state in ("queued", "running"):
            why = f"Run {run_id} is {state}: publish it once it has succeeded"
        else:
            why = (f"Run {run_id} {state}, so it has no model to publish: only a run that succeeded has one. "
                   f"Fix: start a new run and publish that one once it has succeeded")
        super().__init__(why)


def _copy_back(host: str, remote_dir: str, local_dir: str, *, partly: bool = False) -> str:
    """The scp that brings *remote_dir* back as *local_dir* (which does not exist), or, *partly*, its files into it."""
    if partly:
        return f"scp -r {shlex.quote(f'{host}:{remote_dir}/*')} {shlex.quote(local_dir)}/"
    parent, _, name = local_dir.rpartition("/")
    target = shlex.quote(parent) + "/" if remote_dir.rstrip("/").endswith("/" + name) else shlex.quote(local_dir)
    return f"scp -r {shlex.quote(f'{host}:{remote_dir}')} {target}"


class ModelOnHost(PublishRefused):
    def __init__(self, run_id: int, backend: str, host: str, remote_dir: str, local_dir: str, *, partly: bool):
        self.host, self.remote_dir = host, remote_dir
        if partly:
            what = (f"Some of run {run_id}'s model files stayed on {host} in {remote_dir} (larger than "
                    f"max_artifact_mb, or refused by the copy: the run log names them)")
        else:
            what = f"Run {run_id}'s model stayed on {host} in {remote_dir} (fetch_artifacts is false for {backend})"
        super().__init__(
            f"{what}, and publishing needs the model files on this server. Fix: copy them back "
            f"(`{_copy_back(host, remote_dir, local_dir, partly=partly)}`) and publish again, or publish from {host} "
            f"(`{HF_UPLOAD} <owner/name> {shlex.quote(remote_dir)}`)")


class ModelOnAgent(PublishRefused):
    def __init__(self, run_id: int, backend: str, uri: str | None, local_dir: str):
        where = uri or "the agent's --workdir"
        host, _, path = (uri or "").partition(":")
        fix = (f"copy it here (`{_copy_back(host, path, local_dir)}`) and publish again, or publish from "
               f"{host} (`{HF_UPLOAD} <owner/name> {shlex.quote(path)}`)" if path else
               f"copy it into {local_dir}/ and publish again, or publish from the agent's machine")
        super().__init__(
            f"Run {run_id} trained on the agent backend {backend}, whose model stays on the agent's machine "
            f"({where}), and publishing needs the model files on this server. Fix: {fix}")


class ModelFilesMissing(PublishRefused):
    def __init__(self, run_id: int, directory: str, missing: str, *, retained: bool = False):
        if retained:
            text = (f"Run {run_id}'s directory {directory} is gone (model_training.retain_runs deletes the "
                    f"directories of older runs), so its model is no longer on this server. Fix: publish a newer "
                    f"run, or raise retain_runs before the next runs")
        else:
            text = (f"Run {run_id} has no complete model in {directory}: {missing}. Fix: put the model files the "
                    f"trainer saved there (as the run log says) and publish again")
        super().__init__(text)


class CalibrationNotKept(PublishRefused):
    def __init__(self, run_id: int, calibrated_run: int):
        super().__init__(
            f"Run {run_id} kept no calibration (for no schema did it lower both the holdout log-loss and the "
            f"calibration error), so it adds nothing to run {calibrated_run}'s model. Fix: publish run "
            f"{calibrated_run} instead")


class BaseModelUnknown(PublishRefused):
    def __init__(self, run_id: int, base_dir: str):
        super().__init__(
            f"Run {run_id} trained a LoRA adapter on the local model directory {base_dir}, which has no Hub id "
            f"Potato knows, and an adapter loads only on top of its base model. Fix: name the base model's Hub id "
            f"(--base-model owner/name on the command line, Base model on the run page, base_model in the API)")


class NoHubToken(PublishRefused):
    def __init__(self) -> None:
        super().__init__(
            "No Hugging Face token: publishing needs one with write access. Fix: run `hf auth login` as the "
            "account that runs Potato, or set HF_TOKEN in the environment of `potato start` (and of "
            "`potato training publish`); then publish again")


class HubOffline(PublishRefused):
    def __init__(self) -> None:
        super().__init__(
            "HF_HUB_OFFLINE is set, so huggingface_hub reaches no Hub. Fix: unset it for `potato start` "
            "(or for `potato training publish`) to publish")


class PublishInProgress(PublishRefused):
    def __init__(self, run_id: int, repo: str):
        super().__init__(f"Run {run_id} is being published to {repo} already; publish again once that has ended")


class BadPublishRequest(PublishRefused):
    """Raised for a request field that is not valid; the message names the field and what it takes."""


def quoted(value: object, limit: int = 100) -> str:
    """*value*'s repr for a message, cut to *limit* characters (a request may carry megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def bad_repo_name(name: object) -> BadPublishRequest:
    return BadPublishRequest(
        f"{quoted(name)} is not a Hugging Face Hub repo name: give owner/name, the owner being your user or an "
        f"organization (letters, digits, '-', '_' and '.'), e.g. my-lab/review-sentiment")


class HubError(PublishError):
    """Raised when the Hub refuses the upload or cannot be reached."""


class HubTokenRefused(HubError):
    def __init__(self, endpoint: str, from_environment: bool):
        where = ("set HF_TOKEN to it for `potato start` and `potato training publish`" if from_environment else
                 "run `hf auth login` with it as the account that runs Potato")
        super().__init__(
            f"{endpoint} refused the Hugging Face token (401 Unauthorized): it is wrong, expired or revoked. "
            f"Fix: make a token with write access at {endpoint}/settings/tokens and {where}; then publish again")


class HubForbidden(HubError):
    def __init__(self, endpoint: str, user: str, repo: str):
        owner, _, name = repo.partition("/")
        super().__init__(
            f"{endpoint} does not let {user} write to {repo} (403 Forbidden): the repo or its owner {owner} is "
            f"someone else's, or the token may only read. Fix: publish to a repo of your own (e.g. {user}/{name}) "
            f"or of an organization you can write to, or use a token with write access to {owner}")


class HubUnreachable(HubError):
    def __init__(self, endpoint: str, repo: str, run_id: int, cause: str):
        super().__init__(
            f"The upload to {endpoint} failed: {cause}. Run {run_id} and its files are as they were, and the Hub "
            f"takes a commit whole or not at all: {repo} has all of this publish or none of it. Fix: check that this "
            f"server reaches {endpoint} (HF_ENDPOINT names the Hub), then publish again; what already reached the "
            f"Hub is not sent twice")


class HubRefused(HubError):
    def __init__(self, endpoint: str, repo: str, status: int, said: str):
        super().__init__(f"{endpoint} answered {status} to the publish of {repo}: {said}")


class UploadFailed(HubError):
    def __init__(self, cause: str):
        super().__init__(f"The upload failed: {cause}")
