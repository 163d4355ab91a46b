"""The bodies of ``potato start`` and ``potato training register`` (cli.py stays thin).

``start_command`` checks the config with ``potato.validate``'s one validation
function (the same errors and messages as ``potato validate``), prints the
warnings, builds the app with the Prefect API and the dispatcher running
beside it, and serves until SIGTERM or SIGINT, then stops both cleanly.

The WSGI server is waitress when it is installed (measured: bench/agent_load.py
and bench/page_load.py, numbers in docs/agent-protocol.md), else Werkzeug's
threaded server.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

import click

from potato.config import ProjectConfig

log = logging.getLogger(__name__)

# waitress worker threads: agent polls are short, but a Check (ssh) or a
# bundle download can hold a thread for seconds.
WAITRESS_THREADS = 16


def debug_warning(config: ProjectConfig) -> str | None:
    """The warning for ``debug: true`` while an ssh or slurm backend is configured (SPEC §5), or None."""
    if not config.debug:
        return None
    remote = sorted(n for n, b in config.model_training.backends.items() if b.type in ("ssh", "slurm"))
    if not remote:
        return None
    return (f"debug is true and backend(s) {', '.join(remote)} train over ssh: with debug on, this server "
            "grants admin rights to every loopback request, and requests through an ssh run's forwarded "
            "socket arrive from loopback. Set debug: false in the config on a server that trains over ssh")


def check_config(path: str | Path, echo: Callable[..., None] = click.echo) -> ProjectConfig | None:
    """Validate the config for start-up: print errors (return None) or warnings (return the config)."""
    from potato.validate import format_report, validate_config_file

    report = validate_config_file(path)
    if not report.ok:
        echo(format_report(report), err=True)
        echo("The server does not start on an invalid config; fix the errors above "
             f"(check again with: potato validate {path})", err=True)
        return None
    config = report.config
    for warning in report.warnings:
        echo(f"warning: {warning.message}", err=True)
    extra = debug_warning(config)
    if extra:
        echo(f"warning: {extra}", err=True)
    return config


def make_server(app, host: str, port: int, server: str | None = None):
    """A WSGI server for *app* with ``serve_forever()`` and ``close()``; waitress unless asked otherwise."""
    choice = server or "waitress"
    if choice == "waitress":
        try:
            from waitress.server import create_server
        except ImportError:
            log.warning("waitress is not installed; serving with Werkzeug's threaded server")
            choice = "werkzeug"
        else:
            wsgi = create_server(app, host=host, port=port, threads=WAITRESS_THREADS,
                                 ident="potato", clear_untrusted_proxy_headers=True,
                                 channel_timeout=120, connection_limit=1000)
            return _Waitress(wsgi)
    from werkzeug.serving import make_server as werkzeug_server

    return _Werkzeug(werkzeug_server(host, port, app, threaded=True))


class _Waitress:
    def __init__(self, server):
        self.server = server
        self.port = server.effective_port

    def serve_forever(self) -> None:
        # run() returns after KeyboardInterrupt/SystemExit, having stopped its threads.
        self.server.run()

    def close(self) -> None:
        # Let requests in progress finish before the sockets (and waitress's
        # wake-up pipe, which they write to when done) are closed.
        self.server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        self.server.close()


class _Werkzeug:
    def __init__(self, server):
        self.server = server
        self.port = server.port

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def close(self) -> None:
        self.server.server_close()


def start_command(config_path: str | Path, host: str = "127.0.0.1", port: int = 8000, *,
                  server: str | None = None, echo: Callable[..., None] = click.echo) -> int:
    """``potato start CONFIG``: serve the Training page, the admin API and the agent protocol.

    Returns the exit status: 1 on an invalid config (nothing started), 0 after
    a clean stop on SIGTERM/SIGINT.
    """
    from potato.server import create_app

    config = check_config(config_path, echo)
    if config is None:
        return 1
    stop_requested = threading.Event()
    app = create_app(config, start_background=True)
    background = app.extensions["potato.background"]
    try:
        wsgi = make_server(app, host, port, server)
    except OSError as exc:
        background.stop()
        echo(f"Cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port", err=True)
        return 1

    def _stop(signum, frame):
        if stop_requested.is_set():
            return
        stop_requested.set()
        echo(f"Stopping ({signal.Signals(signum).name})…", err=True)
        # Both servers' loops end on KeyboardInterrupt raised in the main thread.
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    shown_host = f"[{host}]" if ":" in host else host
    echo(f"Training page: http://{shown_host}:{wsgi.port}/admin/training")
    if background.prefect_ui_url:
        echo(f"Prefect UI: {background.prefect_ui_url}")
    auto = config.model_training.auto_retrain
    if auto.enabled:
        echo(f"Auto-retrain: a run on {auto.backend or config.model_training.backend} after every "
             f"{auto.update_frequency} new annotations, {auto.min_interval_s:g} s or more after the last run")
    try:
        wsgi.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        wsgi.close()
        background.stop()
        app.extensions["potato.store"].close()
    return 0


def register_command(name: str, config_path: str | Path, *, server_url: str | None = None) -> str:
    """``potato training register NAME CONFIG``: issue agent backend NAME's token; return SPEC §7's text.

    Raises ``click.ClickException`` (exit 1) for an invalid config or a name
    that is not an agent backend.
    """
    from potato.config import load_config
    from potato.errors import ConfigError
    from potato.runs import open_store
    from potato.tokens import TokenError, default_server_url, register_agent, register_text

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    store = open_store(config)
    try:
        token = register_agent(config, store, name)
    except TokenError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        store.close()
    return register_text(name, token, server_url or default_server_url())


if __name__ == "__main__":  # pragma: no cover - handy for a quick manual start
    sys.exit(start_command(sys.argv[1]))
