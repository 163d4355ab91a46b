"""The bodies of ``potato start`` and ``potato training register`` (cli.py stays thin).

``start_command`` checks the config with ``potato.validate``'s one validation
function (the same errors and messages as ``potato validate``), prints the
warnings, catches a live writeback's data files up with the writeback file
(``potato.results.live_writeback.catch_up``), builds the app with the Prefect API
and the dispatcher running beside it, and serves until SIGTERM or SIGINT,
then stops both cleanly.

The WSGI server is waitress when it is installed (measured: bench/agent_load.py
and bench/page_load.py, numbers in docs/agent-protocol.md), else Werkzeug's
threaded server.

waitress reads a request's whole body (up to ``max_request_body_size``,
1 GiB by default) before it calls the app, so on its own it would buffer a
stranger's 600 MiB upload and only then let the app refuse it. Its limits
here come from the largest legitimate body (a predictions upload of
``max_predictions_mb``), and its parser asks the app, as soon as a request's
headers are in, whether it takes the body at all (``potato.protocol.jsonapi.
refusal_before_body``: the same check the app runs itself): a request that
is refused is answered then, before a byte of its body is read.
"""

from __future__ import annotations

import io
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Callable

import click

from potato.config import ProjectConfig
from potato.runs.paths import record_training_page

log = logging.getLogger(__name__)

# waitress worker threads: agent polls are short, but a Check (ssh) or a
# bundle download can hold a thread for seconds.
WAITRESS_THREADS = 16
# Open connections waitress serves at once (more wait in the listen backlog).
# Each may hold up to inbuf_overflow (512 KiB) of a body in memory before
# waitress spills it to a temporary file: 256 of them bound that at 128 MiB,
# and still take bench/agent_load.py's 120 agents with room for the page.
CONNECTION_LIMIT = 256
# Request line and headers: a bearer token, a session cookie, a few proxies' headers.
MAX_HEADER_BYTES = 64 * 1024


def check_config(path: str | Path, echo: Callable[..., None] = click.echo) -> ProjectConfig | None:
    """Validate the config for start-up: print errors (return None) or warnings (return the config)."""
    from potato.validate import format_report, validate_config_file, warning_lines

    report = validate_config_file(path)
    if not report.ok:
        echo(format_report(report), err=True)
        echo("The server does not start on an invalid config; fix the errors above "
             f"(check again with: potato validate {path})", err=True)
        return None
    config = report.config
    for line in warning_lines(report.warnings):
        echo(line, err=True)
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
            return _Waitress(create_server(app, host=host, port=port, **waitress_settings(app)), app)
    from werkzeug.serving import make_server as werkzeug_server

    return _Werkzeug(werkzeug_server(host, port, app, threaded=True))


def waitress_settings(app) -> dict:
    """waitress's adjustments for *app*: its body limit is the largest body a route of the app takes."""
    from potato.protocol.jsonapi import MAX_JSON_BYTES

    largest = max(app.config["POTATO"].model_training.max_predictions_mb * 1024 * 1024, MAX_JSON_BYTES)
    return {
        "threads": WAITRESS_THREADS, "ident": "potato", "clear_untrusted_proxy_headers": True,
        "channel_timeout": 120, "connection_limit": CONNECTION_LIMIT,
        "max_request_header_size": MAX_HEADER_BYTES,
        "max_request_body_size": largest + 1,  # waitress refuses a body of this size or more
    }


def _gated_channel(app):
    """A waitress channel class whose parser asks *app* whether to take a body once the headers are in."""
    from waitress.channel import HTTPChannel
    from waitress.parser import HTTPRequestParser
    from waitress.task import WSGITask
    from waitress.utilities import Error, RequestEntityTooLarge

    from potato.protocol.jsonapi import refusal_before_body

    class Refused(Error):
        """waitress's error answer, made of the app's own JSON response."""

        def __init__(self, response):
            super().__init__(response.get_data(as_text=True))
            self.response = response

        def to_response(self, ident=None):
            headers = [(k, v) for k, v in self.response.headers.items() if k.lower() != "content-length"]
            return self.response.status, headers, self.response.get_data()

    class GatedParser(HTTPRequestParser):
        def __init__(self, adj, channel):
            super().__init__(adj)
            self.channel = channel

        def received(self, data):
            waiting = not self.headers_finished
            consumed = super().received(data)
            # Headers in, a body announced: also when waitress itself found it over its
            # limit, so that the app's own answer (a 401 first, JSON) is the one sent.
            announced = self.content_length > 0 or self.chunked
            if waiting and self.headers_finished and announced and \
                    (self.error is None or isinstance(self.error, RequestEntityTooLarge)):
                environ = WSGITask(self.channel, self).get_environment()
                environ["wsgi.input"] = io.BytesIO()  # nothing of the body is read here
                if self.chunked:  # waitress took the header out: say that a body comes
                    environ["HTTP_TRANSFER_ENCODING"] = "chunked"
                try:
                    response = refusal_before_body(app, environ)
                except Exception:  # noqa: BLE001 - the app runs the same check again, with its handlers
                    log.exception("The before-body check failed on waitress's I/O thread")
                    response = None
                if response is not None:
                    self.error = Refused(response)
                    self.completed = True
                    # No "100 Continue" for a body that is refused (sending it also marks
                    # the request incomplete again, and waitress would wait for the body).
                    self.expect_continue = False
            return consumed

    class GatedChannel(HTTPChannel):
        def parser_class(self, adj):
            return GatedParser(adj, self)

    return GatedChannel


class _Waitress:
    def __init__(self, server, app):
        self.server = server
        self.port = server.effective_port
        server.channel_class = _gated_channel(app)

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


def training_page(config: ProjectConfig, host: str, port: int) -> str:
    """The Training page's address on *host*:*port*, recorded for the links a run leaves in Prefect's
    artifacts (a server on every interface is recorded under this host's name)."""
    shown = f"[{host}]" if ":" in host else host
    record_training_page(config, f"http://{socket.getfqdn() if host in ('0.0.0.0', '::') else shown}:{port}"
                                 "/admin/training")
    return f"http://{shown}:{port}/admin/training"


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
    from potato.results.live_writeback import catch_up

    # A live writeback cut short (a killed process) left some data files behind the writeback file.
    catch_up(config, lambda line: echo(line, err=True))
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
    echo(f"Training page: {training_page(config, host, wsgi.port)}")
    if background.prefect_ui_url:
        echo(f"Prefect UI: {background.prefect_ui_url}")
    auto = config.model_training.auto_retrain
    if auto.enabled:
        echo(f"Auto-retrain: a run on {auto.backend or config.model_training.backend} after every "
             f"{auto.update_frequency} new annotations, {auto.min_interval_s:g} s or more after the last run")
    from potato.results.cold_start_writeback import start_if_needed, started_text

    cold = start_if_needed(config, app.extensions["potato.runs.store"])
    if cold is not None:
        echo(started_text(cold))
    try:
        wsgi.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        wsgi.close()
        background.stop()
        app.extensions["potato.runs.store"].close()
    return 0


def register_command(name: str, config_path: str | Path, *, server_url: str | None = None) -> str:
    """``potato training register NAME CONFIG``: issue agent backend NAME's token; return the text to print.

    Raises ``click.ClickException`` (exit 1) for an invalid config or a name
    that is not an agent backend.
    """
    from potato.config import load_config
    from potato.errors import ConfigError
    from potato.runs.paths import open_store
    from potato.runs.tokens import TokenError, default_server_url, register_agent, register_text

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
