"""Agent tokens: issue, check and recognise the bearer tokens of the agent protocol.

Two kinds (docs/agent-protocol.md, "Authentication"):

- a **backend token** for an ``agent`` backend, issued by ``potato training
  register NAME CONFIG``. It lets any agent started with it claim
  that backend's jobs. Registering again replaces it.
- a **run token** for the agent that an ssh or slurm run starts on its host:
  valid for that one run only, handed to the agent on standard input, never
  on a command line.

Only ``hash_token(token)`` is stored (the store's ``tokens`` table and the
run's ``run_token_hash``); a token is shown once, when issued. Comparisons
are constant-time.
"""

from __future__ import annotations

import hmac
import secrets
import socket

from potato.config import BackendConfig, ProjectConfig
from potato.errors import TokenError
from potato.runs.store import Run, Store, hash_token

# 32 random bytes, ~43 URL-safe characters (token_urlsafe(32)).
TOKEN_BYTES = 32
DEFAULT_PORT = 8000


def new_token() -> str:
    """Return a fresh random token (``secrets.token_urlsafe(32)``)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def tokens_equal(token: str, expected_hash: str | None) -> bool:
    """Whether ``hash_token(token)`` equals *expected_hash*, compared in constant time."""
    if not expected_hash:
        # Compare anyway, so the timing does not tell "no hash" from "wrong token".
        hmac.compare_digest(hash_token(token).encode(), ("0" * 64).encode())
        return False
    return hmac.compare_digest(hash_token(token).encode(), expected_hash.encode())


def _agent_backend(config: ProjectConfig, name: str) -> BackendConfig:
    backends = config.model_training.backends
    backend = backends.get(name)
    if backend is None:
        agents = sorted(n for n, b in backends.items() if b.type_info.claimed_by_agent)
        hint = (f"agent backends in this config: {', '.join(agents)}" if agents else
                "this config has no agent backend; add one under model_training.backends "
                "with type: agent")
        raise TokenError(f"No backend named {name!r} in model_training.backends; {hint}")
    if not backend.type_info.claimed_by_agent:
        raise TokenError(
            f"Backend {name!r} is a {backend.type} backend; only agent backends get a token "
            f"from `potato training register` (the server starts the agent of a {backend.type} "
            "run itself, with a token for that run only)"
        )
    return backend


def register_agent(config: ProjectConfig, store: Store, name: str) -> str:
    """Issue a new token for agent backend *name*, replacing any earlier one; return it.

    Only its hash is stored. Raises ``TokenError`` for an unknown or non-agent backend.
    """
    _agent_backend(config, name)
    token = new_token()
    store.set_token(name, hash_token(token))
    return token


def default_server_url(port: int = DEFAULT_PORT) -> str:
    """The URL agents most likely reach this server at: this host's name and *port*."""
    return f"http://{socket.getfqdn()}:{port}"


def register_text(name: str, token: str, server_url: str) -> str:
    """The text ``potato training register`` prints (word for word; a test holds it)."""
    return (
        f"Token for backend {name!r} (shown once; registering again replaces it):\n"
        "\n"
        f"  {token}\n"
        "\n"
        "On the training machine:\n"
        "\n"
        f"  export POTATO_TRAINING_TOKEN={token}\n"
        f"  potato training agent --server {server_url} --backend {name}\n"
    )


def issue_run_token(store: Store, run_id: int) -> str:
    """Issue the token of run *run_id* for the agent of an ssh or slurm run; return it.

    The run's ``run_token_hash`` is set (replacing any earlier one). Send the
    token to the agent on its standard input, never on its command line.
    """
    token = new_token()
    store.update_run(run_id, run_token_hash=hash_token(token))
    return token


def backend_of_token(config: ProjectConfig, store: Store, token: str) -> str | None:
    """The agent backend whose current token *token* is, or None.

    Every agent backend is compared (constant-time each), whichever matches.
    """
    found = None
    for name, backend in sorted(config.model_training.backends.items()):
        if backend.type_info.claimed_by_agent and store.verify_token(name, token):
            found = name
    return found


def run_of_token(store: Store, token: str, runs: list[Run]) -> Run | None:
    """The run among *runs* whose run token *token* is, or None."""
    found = None
    for run in runs:
        if tokens_equal(token, run.run_token_hash):
            found = run
    return found
