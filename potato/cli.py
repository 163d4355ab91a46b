"""The ``potato`` command: validate, start, and the training commands.

Heavy modules (prefect, flask, torch) are imported inside the commands that
need them, so ``potato validate`` stays fast.
"""

from __future__ import annotations

import os
import sys

import click


@click.group()
@click.version_option(package_name="potato-annotation")
def main() -> None:
    """Potato's model training."""
    # What training writes (the run store, run directories, bundles, models, predictions)
    # is for the account that runs Potato only: files 0600, directories 0700.
    os.umask(0o077)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--strict", is_flag=True, help="Fail on warnings too (acknowledged ones excepted).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def validate(config: str, strict: bool, as_json: bool) -> None:
    """Check CONFIG: errors exit 1; with --strict, unacknowledged warnings too."""
    from potato.validate import run_validate_command

    sys.exit(run_validate_command(config, strict=strict, as_json=as_json))


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--host", default="127.0.0.1", show_default=True)
def start(config: str, port: int, host: str) -> None:
    """Serve the Training page, the admin API and the agent protocol."""
    from potato.server.commands import start_command

    sys.exit(start_command(config, host=host, port=port))


@main.group()
def training() -> None:
    """Run, follow, cancel and check training runs."""


def _load(config: str):
    from potato.config import load_config
    from potato.errors import ConfigError

    try:
        return load_config(config)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _named(exc: Exception, config: str) -> str:
    """The error's message; an unknown run's names the command that lists this project's runs."""
    from potato.errors import UnknownRun

    return str(UnknownRun(exc.run_id, config)) if isinstance(exc, UnknownRun) else str(exc)


def _not_started(store, run_id: int, exc: Exception, config: str) -> str:
    """Why the run this command queued did not start (its Prefect API did not), and what to do: it ends failed,
    so that a later run does not queue behind it; one a ``potato start`` took meanwhile goes on there."""
    if store.transition(run_id, "failed", from_states=("queued",), error=str(exc)):
        return f"{exc}. Run {run_id} did not start and is marked failed; start it again: potato training run {config}"
    return f"{exc}. Run {run_id} was started by another process (a potato start?): potato training runs {config}"


def _parse_options(pairs: tuple[str, ...]) -> dict:
    import json

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
            continue
        try:
            json.dumps(options[key], allow_nan=False)
        except ValueError:  # json.loads reads NaN and 1e999; the store (and a browser) cannot
            raise click.BadParameter(f"{pair!r} is not a finite number; use a number", param_hint="--option") \
                from None
    return options


@training.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--backend", help="A backend of model_training.backends (default: model_training.backend, else local).")
@click.option("--trainer", help="The trainer for every schema (default: each schema's kind's own, e.g. "
              "hf-text-classification for radio, hf-span-tagging for span).")
@click.option("--schema", "schemas", multiple=True, help="A schema to train (repeatable; default: writeback.schemas).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="A trainer option (JSON value), e.g. epochs=3.")
@click.option("--curve", is_flag=True, help="Also a learning curve: train on 25/50/75 % of the labels and score "
              "each on the same holdout (the trainer option curve=true; it adds up to about twice the run's training time).")
@click.option("--detach", is_flag=True, help="Queue the run and return; a running `potato start` dispatches it.")
def training_run(config, backend, trainer, schemas, options, curve, detach) -> None:
    """Queue a training run and follow it to its end (exit 0 when it succeeds)."""
    import time
    from contextlib import ExitStack

    from potato.errors import PrefectApiError, RunRequestError
    from potato.follow import follow, next_steps, prefect_ready, prefect_starting, still_waiting
    from potato.runs.dispatcher import Dispatcher
    from potato.runs.paths import open_store
    from potato.runs.prefect_api import embedded_prefect
    from potato.runs.queue import by_account, cancel_run, create_run
    from potato.runs.reconcile import reconcile
    from potato.trainer_choice import NoTrainerFor, describe_plan
    from potato.validate import warning_lines

    cfg = _load(config)
    for line in warning_lines(cfg.warnings):  # as potato validate and potato start say them
        click.echo(line, err=True)
    store = open_store(cfg)
    try:
        run = create_run(cfg, store, trainer=trainer, schemas=list(schemas) or None, backend=backend,
                         options={**_parse_options(options), **({"curve": True} if curve else {})})
    except NoTrainerFor as exc:
        raise click.UsageError(str(exc)) from None
    except RunRequestError as exc:
        raise click.ClickException(str(exc)) from None
    where = cfg.model_training.backends[run.backend].describe()
    click.echo(f"Run {run.id} queued: {describe_plan(run.trainers)} on {', '.join(run.schemas)}, runs on {where}")
    if detach:
        return
    click.echo(prefect_starting())
    started = time.monotonic()
    with ExitStack() as stack:
        try:
            with still_waiting(sys.stdout, "Prefect is still starting"):
                api = stack.enter_context(embedded_prefect(cfg.training_dir))
        except PrefectApiError as exc:
            raise click.ClickException(_not_started(store, run.id, exc, config)) from None
        click.echo(prefect_ready(api, time.monotonic() - started))
        dispatcher = Dispatcher(cfg, store)
        reconcile(cfg, store)
        tty = sys.stdout.isatty()
        while True:
            try:
                final = follow(store, run.id, sys.stdout, tty=tty, tick=dispatcher.dispatch_once)
                break
            except KeyboardInterrupt:
                click.echo("")
                if not sys.stdin.isatty() or click.confirm(f"Cancel run {run.id}?", default=True):
                    cancel_run(cfg, store, run.id, by=by_account("Ctrl-C in potato training run"))
                    click.echo(f"Cancelling run {run.id}…")
                    continue
                click.echo(f"Run {run.id} goes on; see it with: potato training runs {config}")
                sys.exit(130)
        dispatcher.wait_for_flows()
    if final.state == "succeeded":
        from potato.results.quality_gate import read as read_gate
        from potato.results.writeback import live_run_ids, writeback_path
        from potato.runs.paths import run_paths
        from potato.text.score_text import curve_lines

        for line in curve_lines(final.scores):
            click.echo(line)
        for verdict in (read_gate(run_paths(cfg, final.id)) or {}).get("schemas", []):
            click.echo(f"Quality gate: {verdict['text']}")
        if final.id in live_run_ids(cfg):
            click.echo(f"Predictions written back to {writeback_path(cfg)}")
    for line in next_steps(config, final.id):
        click.echo(line)
    sys.exit(0 if final.state == "succeeded" else 1)


@training.command("runs")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def training_runs(config, limit, as_json) -> None:
    """List the project's runs, newest first."""
    import json

    from potato.follow import format_duration, format_scores, format_time, run_duration
    from potato.results import stability
    from potato.results.promote import predictions_state
    from potato.results.quality_gate import read_pins
    from potato.results.writeback import live_run_ids
    from potato.runs.paths import open_store

    cfg = _load(config)
    store = open_store(cfg)
    listed = store.list_runs(limit=limit)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in listed], indent=2))
        return
    if not listed:
        click.echo("No runs yet. Start one with: potato training run " + config)
        return
    header = ("ID", "STATE", "TRIGGER", "RAN ON", "STARTED", "DURATION", "PREDICTIONS", "CHANGED", "SCORES")
    live, pins = live_run_ids(cfg), read_pins(cfg)
    rows = []
    for r in listed:
        started = format_time(r.started_at)
        rows.append((str(r.id), r.state, r.trigger, r.backend, started, format_duration(run_duration(r)),
                     predictions_state(cfg, r, live, pins), stability.cell(stability.read(cfg, r.id)),
                     format_scores(r.scores)))
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header) - 1)]
    for row in [header] + rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])


@training.command("cancel")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_id", type=int)
def training_cancel(config, run_id) -> None:
    """Cancel run RUN_ID (a queued run ends at once; an active one is stopped)."""
    from potato.errors import StoreError
    from potato.runs.paths import open_store
    from potato.runs.queue import by_account, cancel_run

    cfg = _load(config)
    store = open_store(cfg)
    try:
        before = store.get_run(run_id)
        run = cancel_run(cfg, store, run_id, by=by_account("potato training cancel"))
    except StoreError as exc:
        raise click.ClickException(_named(exc, config)) from None
    if before.state in ("succeeded", "failed", "cancelled"):
        click.echo(f"Run {run_id} already ended: {before.state}")
    elif run.state == "cancelled":
        click.echo(f"Run {run_id} was queued and is now cancelled")
    else:
        grace = cfg.model_training.grace_seconds
        click.echo(f"Run {run_id}: cancel requested; the worker gets SIGTERM, then SIGKILL after {grace:g} s")


@training.command("compare")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_ids", type=int, nargs=-1, required=True, metavar="RUN_ID RUN_ID...")
@click.option("--json", "as_json", is_flag=True)
def training_compare(config, run_ids, as_json) -> None:
    """Show runs side by side: options, data, scores per schema and label, curves, confusion matrices."""
    import json

    from potato.errors import CompareError, StoreError
    from potato.run_comparison import compare
    from potato.runs.paths import open_store

    cfg = _load(config)
    try:
        comparison = compare(cfg, open_store(cfg), run_ids)
    except (CompareError, StoreError) as exc:
        raise click.ClickException(_named(exc, config)) from None
    click.echo(json.dumps(comparison.as_dict(), indent=2, ensure_ascii=False) if as_json else comparison.text())


@training.command("retract")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_id", type=int)
def training_retract(config, run_id) -> None:
    """Take run RUN_ID's predictions away from annotators; the newest earlier run's come back, per schema."""
    from potato.errors import RetractError, StoreError
    from potato.results.retract import retract
    from potato.runs.paths import open_store

    cfg = _load(config)
    try:
        result = retract(cfg, open_store(cfg), run_id)
    except (RetractError, StoreError) as exc:
        raise click.ClickException(_named(exc, config)) from None
    click.echo(result.describe())
    if result.live is not None and not result.live.error and (result.live.files or result.live.problems):
        click.echo(result.live.describe())


@training.command("promote")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_id", type=int)
def training_promote(config, run_id) -> None:
    """Write run RUN_ID's predictions back although the quality gate held them back."""
    from potato.errors import PromoteError, StoreError, WritebackError
    from potato.results.promote import promote
    from potato.runs.paths import open_store
    from potato.runs.queue import by_account

    cfg = _load(config)
    try:
        summary, live = promote(cfg, open_store(cfg), run_id, by=by_account("potato training promote"))
    except (PromoteError, StoreError, WritebackError) as exc:
        raise click.ClickException(_named(exc, config)) from None
    click.echo(f"Run {run_id} promoted: annotators see its predictions now")
    click.echo(summary.describe())
    if live is not None:
        click.echo(live.describe())


@training.command("pin")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_id", type=int)
def training_pin(config, run_id) -> None:
    """Keep run RUN_ID's predictions with annotators: the quality gate holds back newer runs until unpin."""
    _pin(config, run_id, True)


@training.command("unpin")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_id", type=int)
def training_unpin(config, run_id) -> None:
    """Let newer runs that pass the quality gate replace run RUN_ID's predictions again."""
    _pin(config, run_id, False)


def _pin(config: str, run_id: int, pinned: bool) -> None:
    from potato.errors import PromoteError, StoreError
    from potato.results.promote import pin
    from potato.runs.paths import open_store

    cfg = _load(config)
    try:
        click.echo(pin(cfg, open_store(cfg), run_id, pinned))
    except (PromoteError, StoreError) as exc:
        raise click.ClickException(_named(exc, config)) from None


@training.command("publish")
@click.argument("config", type=click.Path(dir_okay=False))
@click.argument("run_id", type=int)
@click.option("--repo", required=True, metavar="OWNER/NAME", help="The Hub repo to publish to (made if missing).")
@click.option("--public", is_flag=True, help="Make a new repo public (default: private; a repo that exists keeps its visibility).")
@click.option("--revision", default="main", show_default=True, help="The branch to commit to (made from main if missing).")
@click.option("--message", help="The commit message (default: Potato run N: trainer on schemas).")
@click.option("--base-model", metavar="OWNER/NAME", help="The base model's Hub id, when Potato cannot tell it (a LoRA adapter trained on a local directory).")
@click.option("--license", "license_", help="The card's license, e.g. apache-2.0 (default: model_training.license).")
def training_publish(config, run_id, repo, public, revision, message, base_model, license_) -> None:
    """Publish run RUN_ID's model with its model card to the Hugging Face Hub (HF_ENDPOINT; token: HF_TOKEN or `hf auth login`)."""
    from potato.publish.job import publish_command

    body = {"repo": repo, "private": not public, "revision": revision, "message": message,
            "base_model": base_model, "license": license_}
    sys.exit(publish_command(_load(config), run_id, body, echo=click.echo))


@training.command("register")
@click.argument("name")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--server-url", help="The URL agents reach this server at (default http://<this host>:8000).")
def training_register(name: str, config: str, server_url: str | None) -> None:
    """Issue a token for agent backend NAME (shown once; registering again replaces it)."""
    from potato.server.commands import register_command

    click.echo(register_command(name, config, server_url=server_url), nl=False)


@training.command("agent", context_settings={"show_default": True})
@click.option("--server", required=True, help="The annotation server's URL, e.g. https://annotate.example.org")
@click.option("--backend", required=True, help="The agent backend whose jobs to run.")
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True),
              help="Read the token from this file instead of POTATO_TRAINING_TOKEN.")
@click.option("--python", help="The worker's interpreter (default: this agent's own).")
@click.option("--once", is_flag=True, help="Exit after one job.")
@click.option("--workdir", default="~/.cache/potato-training", help="Where jobs and their models are kept.")
@click.option("--keep", is_flag=True, help="Keep each job's bundle.")
@click.option("--slurm-config", type=click.Path(dir_okay=False, exists=True),
              help="Submit each worker with sbatch: a JSON object of the slurm backend keys (--workdir on shared storage).")
@click.option("--offline-limit", type=click.FloatRange(min=0, min_open=True, max=1e9), default=300.0,
              metavar="SECONDS", help="Stop a job's worker (its run ends) after this long without the server (default 300).")
def training_agent(server, backend, token_file, python, once, workdir, keep, slurm_config, offline_limit) -> None:
    """Run an agent backend's jobs on this machine, polling the server (no inbound port needed)."""
    from potato.training.agent import main as agent_main

    argv = ["--server", server, "--backend", backend, "--workdir", workdir, "--offline-limit", repr(offline_limit)]
    argv += ["--token-file", token_file] if token_file else []
    argv += ["--python", python] if python else []
    argv += ["--once"] * once + ["--keep"] * keep
    argv += ["--slurm-config", slurm_config] if slurm_config else []
    sys.exit(agent_main(argv))


@training.command("check")
@click.argument("backend")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def training_check(backend, config, as_json) -> None:
    """Check BACKEND: could a run start there, and where would it run? Exit 0 if so."""
    import json

    from potato.backends.checks import check_backend
    from potato.errors import UnknownBackendError

    cfg = _load(config)
    if backend not in cfg.model_training.backends:
        raise click.ClickException(str(UnknownBackendError(backend, cfg.model_training.backends)))
    report = check_backend(cfg, backend)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.text())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
