"""What runs beside the web server for its lifetime: the embedded Prefect API, the dispatcher, the
auto-retrain watcher and the uploads to the Hugging Face Hub."""

from __future__ import annotations

import logging
import threading

from potato.config import ProjectConfig
from potato.publish.job import Publisher
from potato.runs.auto_retrain import AutoRetrainWatcher
from potato.runs.store import Store

log = logging.getLogger(__name__)


class Background:
    """Starts the Prefect API (``prefect_api.start_embedded``), the run ``Dispatcher``,
    ``auto_retrain.AutoRetrainWatcher`` and ``publish.job.Publisher``; stops them."""

    def __init__(self, config: ProjectConfig, store: Store):
        self.config = config
        self.store = store
        self.prefect = None
        self.dispatcher = None
        # Built now (it is cheap), so the admin API can show its status; it watches from start().
        self.watcher = AutoRetrainWatcher(config, store)
        self.publisher = Publisher(store)
        self.prefect_ui_url: str | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        from potato.runs.dispatcher import Dispatcher
        from potato.runs.prefect_api import start_embedded, ui_url_for

        self.prefect = start_embedded(self.config.training_dir)
        self.prefect_ui_url = ui_url_for(self.prefect.url)
        log.info("Prefect API at %s", self.prefect.url)
        try:
            self.dispatcher = Dispatcher(self.config, self.store)
            self.dispatcher.start()
            self.watcher.start()
            self.publisher.start()
        except BaseException:
            self.prefect.stop()
            raise

    def stop(self) -> None:
        """Stop the dispatcher (and the flows it started), then the Prefect API. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.watcher.stop()
        self.publisher.stop()
        if self.dispatcher is not None:
            try:
                self.dispatcher.stop()
            except Exception:
                log.exception("Stopping the dispatcher failed")
        if self.prefect is not None:
            try:
                self.prefect.stop()
            except Exception:
                log.exception("Stopping the Prefect API failed")
