"""Serve a project's app in this process for the benchmarks (no Prefect, no dispatcher).

    python bench/_server.py CONFIG PORT SERVER      # SERVER: waitress | werkzeug | gunicorn

Prints ``ready`` when listening; stops on SIGTERM.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    config_path, port, server = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    import logging

    # No per-request access log (werkzeug) or queue-depth notes (waitress) in the figures' output.
    logging.basicConfig(level=logging.ERROR)
    for name in ("werkzeug", "waitress", "waitress.queue"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from potato.config import load_config
    from potato.server import create_app
    from potato.server.commands import make_server

    app = create_app(load_config(config_path), start_background=False)
    if server == "gunicorn":
        from gunicorn.app.base import BaseApplication

        class _App(BaseApplication):
            def load_config(self):
                # One process: the agent routes keep claims and event cursors in memory.
                for key, value in {"bind": f"127.0.0.1:{port}", "workers": 1, "threads": 16,
                                   "worker_class": "gthread", "accesslog": None, "loglevel": "warning"}.items():
                    self.cfg.set(key, value)

            def load(self):
                return app

        print("ready", flush=True)
        _App().run()
        return
    wsgi = make_server(app, "127.0.0.1", port, server)

    def _stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    print("ready", flush=True)
    try:
        wsgi.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        wsgi.close()


if __name__ == "__main__":
    main()
