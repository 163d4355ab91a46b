"""The admin API's publishing routes (``/admin/training/api/runs/<id>/…``): publish to the Hub, download.

- ``GET  …/publish`` — could this run's model be downloaded (``downloadable``) and published (``ready``;
  ``refusal`` when there is no model here, ``hub_note`` when only the Hub cannot be reached: no token, or
  offline), and how its last publish went: ``{"run_state", "ready", "downloadable", "refusal", "hub_note",
  "files", "bytes", "kind", "base_model", "hub", "publication"}``;
- ``POST …/publish`` — JSON ``{"repo": "owner/name", "private": true, "revision": "main",
  "message", "base_model", "license"}``: checked and claimed now (400 for a bad field,
  409 for a run that cannot be published, with the reason and the fix), uploaded by
  ``potato start``'s ``Publisher`` afterwards (202); the run's ``publication`` says how far;
- ``GET  …/model.tar.gz`` — the model and its card, streamed.

Admins only, as the rest of the admin API (the page's session or ``X-API-Key``).
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from potato.protocol.jsonapi import ApiError, json_body
from potato.publish import publication, publish_errors
from potato.publish.archive import archive_name, stream_tar_gz
from potato.publish.hub import hub_endpoint, hub_token, without_credentials
from potato.publish.job import prepare
from potato.publish.plan import make_plan, request_from
from potato.server.auth import admin_via, require_admin
from potato.server.context import get_config, get_store

bp = Blueprint("publish_api", __name__, url_prefix="/admin/training/api")

VIA = {"session": "page", "header": "api", "debug": "api"}


def _refused(exc: publish_errors.PublishRefused) -> ApiError:
    return ApiError(400 if isinstance(exc, publish_errors.BadPublishRequest) else 409, str(exc))


@bp.get("/runs/<run_id:run_id>/publish")
@require_admin
def publish_status(run_id: int):
    config, store = get_config(), get_store()
    run = store.get_run(run_id)
    answer = {"run_state": run.state, "ready": False, "downloadable": False, "refusal": None, "hub_note": None,
              "files": 0, "bytes": 0, "kind": None, "base_model": None, "hub": without_credentials(hub_endpoint()),
              "publication": publication.view(run.publication)}
    try:
        plan = make_plan(config, store, run_id, for_hub=False)
    except publish_errors.PublishRefused as exc:  # no model here: neither a download nor a publish
        answer["refusal"] = str(exc)
        return jsonify(answer)
    answer.update(downloadable=True, kind=plan.facts.kind, base_model=plan.facts.base_model,
                  files=len(plan.model_files) + 1, bytes=sum(f.size for f in plan.files(None)))
    try:
        hub_token()
    except publish_errors.PublishRefused as exc:  # no token, or offline: the download stays offered
        answer["hub_note"] = str(exc)
    else:
        answer["ready"] = True
    return jsonify(answer)


@bp.post("/runs/<run_id:run_id>/publish")
@require_admin
def publish(run_id: int):
    config, store = get_config(), get_store()
    store.get_run(run_id)  # 404 for an unknown run
    try:
        request = request_from(json_body(), default_license=config.model_training.license)
        prepared = prepare(config, store, run_id, request, via=VIA.get(admin_via(), "api"))
    except publish_errors.PublishRefused as exc:
        raise _refused(exc) from None
    current_app.extensions["potato.background"].publisher.submit(prepared)
    response = jsonify({"publication": publication.view(store.get_run(run_id).publication)})
    response.status_code = 202
    return response


@bp.get("/runs/<run_id:run_id>/model.tar.gz")
@require_admin
def download(run_id: int):
    try:
        plan = make_plan(get_config(), get_store(), run_id, for_hub=False)
    except publish_errors.PublishRefused as exc:
        raise _refused(exc) from None
    name = archive_name(run_id)
    return Response(stream_tar_gz(plan.files(None), name), mimetype="application/gzip",
                    headers={"Content-Disposition": f'attachment; filename="{name}.tar.gz"',
                             "Cache-Control": "no-store"})
