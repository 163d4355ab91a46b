"""The Training page (``/admin/training``) and run pages: HTML shells that poll the admin API.

The pages render their first state on the server (so they read without
JavaScript) and then update themselves from the admin API's JSON about once a
second. Every asset is served from this blueprint's ``static/``: no CDN.
"""

from __future__ import annotations

from flask import Blueprint, redirect, render_template, request, url_for

from potato.errors import CompareError, UnknownRun
from potato.run_comparison import SECTIONS, compare, parse_runs
from potato.server.auth import CSRF_HEADER, CSRF_VALUE, admin_via, log_in, log_out
from potato.server.context import get_config, get_store
from potato.server.serialize import backends_json, writeback_json
from potato.trainer_choice import default_schemas, default_trainer, describe_plan
from potato.training.trainers.registry import TRAINERS

bp = Blueprint("page", __name__, url_prefix="/admin/training",
               template_folder="templates", static_folder="static", static_url_path="/static")


def _safe_next(target: str | None) -> str:
    # Only paths on this server: never redirect off-site after a login, and no
    # control characters (a CR/LF would end the Location header early).
    if target and target.startswith("/admin/training") and "//" not in target and "\\" not in target \
            and ".." not in target and target.isprintable():
        return target
    return url_for("page.training")


def _needs_login():
    return redirect(url_for("page.login", next=request.full_path.rstrip("?")))


@bp.route("/login", methods=["GET", "POST"])
def login():
    config = get_config()
    error = None
    status = 200
    if request.method == "POST":
        if log_in(request.form.get("api_key")):
            return redirect(_safe_next(request.form.get("next")))
        error = "That is not the admin key (admin_api_key in the config)."
        status = 401
    if not config.admin_api_key:
        error = "This server has no admin_api_key in its config; set one to use the Training page."
    return render_template("login.html", error=error, next=request.values.get("next", ""),
                           title=config.annotation_task_name), status


@bp.post("/logout")
def logout():
    log_out()
    return redirect(url_for("page.login"))


@bp.get("/")
@bp.get("")
def training():
    if admin_via() is None:
        return _needs_login()
    config = get_config()
    return render_template(
        "training.html",
        title=config.annotation_task_name,
        backends=backends_json(config),
        trainers=sorted(TRAINERS),
        schemas=[{"name": s.name, "kind": s.kind, "trainer": default_trainer(s.kind)} for s in config.schemes],
        default_schemas=set(default_schemas(config)),
        writeback=writeback_json(config, get_store()),
        grace_seconds=f"{config.model_training.grace_seconds:g}",
        csrf_header=CSRF_HEADER, csrf_value=CSRF_VALUE,
    )


@bp.get("/compare")
def compare_page():
    """Runs side by side, ``?runs=7,9`` (the Training page's Compare button); what cannot be compared is said."""
    if admin_via() is None:
        return _needs_login()
    config = get_config()
    try:
        comparison, error, status = compare(config, get_store(), parse_runs(request.args.get("runs"))), None, 200
    except CompareError as exc:
        comparison, error, status = None, str(exc), 400
    except UnknownRun as exc:
        comparison, error, status = None, str(exc), 404
    return render_template("compare.html", title=config.annotation_task_name, comparison=comparison,
                           sections=SECTIONS, error=error), status


@bp.get("/runs/<run_id:run_id>")
def run_page(run_id: int):
    if admin_via() is None:
        return _needs_login()
    config = get_config()
    run = get_store().get_run(run_id)  # unknown → 404 JSON via the app's handler
    return render_template(
        "run.html", title=config.annotation_task_name, run=run, trainers=describe_plan(run.trainers),
        ran_on=config.model_training.backends[run.backend].describe()
        if run.backend in config.model_training.backends else run.backend,
        grace_seconds=f"{config.model_training.grace_seconds:g}",
        csrf_header=CSRF_HEADER, csrf_value=CSRF_VALUE,
    )
