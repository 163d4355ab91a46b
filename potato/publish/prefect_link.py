"""Where a run was published, as a link on its Prefect flow run: the Artifacts page shows the Hub repository.

The link is keyed per project (``potato-<project>-hub-repo``), as the run's
report is, so the Artifacts page keeps one history per project with a
version per publish, and it belongs to the flow run that trained the model.
It is created through Prefect's API client for that flow run (not from
inside a flow, which a publish is not). Prefect being away never fails a
publish: the model is on the Hub either way, and the log says why there is
no link.
"""

from __future__ import annotations

import logging

from potato.publish.hub import Published
from potato.results.run_report import HUB_REPO, artifact_key
from potato.runs.prefect_api import is_healthy
from potato.runs.store import Run

log = logging.getLogger(__name__)


def link_published(run: Run, published: Published, project_key: str) -> bool:
    """Add *published*'s repository to run *run*'s flow run as a link artifact; False (logged) where it cannot."""
    if not run.prefect_flow_run_id:
        return False
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    # The client retries an API that does not answer for minutes; one that is not there is skipped at once.
    if not api or not is_healthy(api):
        log.info("Run %s was published; no link on its Prefect flow run: Prefect's API is not reachable", run.id)
        return False
    artifact = ArtifactCreate(
        key=artifact_key(project_key, HUB_REPO), type="markdown", flow_run_id=run.prefect_flow_run_id,
        data=f"[{published.repo} on the Hugging Face Hub]({published.url})",
        description=f"Run {run.id} published to {published.repo} (commit {published.commit[:12]})")
    try:
        with get_client(sync_client=True) as client:
            # The API call create_artifact makes, without the event it then queues: outside a flow that
            # queue is drained at the process's exit, and a CLI would end with Prefect's "Still processing
            # items" on its stderr.
            client.request("POST", "/artifacts/", json=artifact.model_dump(mode="json", exclude_unset=True))
    except Exception as exc:  # the model is published whatever Prefect says
        log.warning("Run %s was published; its link on Prefect's flow run failed: %s: %s", run.id,
                    type(exc).__name__, exc)
        return False
    return True
