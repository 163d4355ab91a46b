"""The ``agent`` backend type: a machine the server cannot reach polls it for work.

Someone runs ``potato training agent --server URL --backend NAME`` there,
with the backend's token (``potato training register``); the run waits,
queued to the user, until that agent claims it. Its steps are in ``steps.py``.
"""

from __future__ import annotations

from potato.backend_types import keys
from potato.backend_types.contract import BackendType
from potato.config_keys import Key

AGENT = BackendType(
    name="agent", article="an", menu="{name} (agent)",
    claimed_by_agent=True,
    steps="potato.backends.agent.steps",
    check="potato.backends.agent.steps:check",
    keys=(
        keys.TYPE,
        keys.DESCRIPTION,
        keys.HEARTBEAT,
        Key("queue_timeout_s", "float", "a run no agent picks up within this long fails",
            minimum=0, default_text="— (wait until cancelled)"),
    ),
    doc="""A machine the server cannot reach; `potato training agent` there polls the server.""",
)
