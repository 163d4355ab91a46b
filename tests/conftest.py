"""Session-wide fixtures live in tests/support/*_fixtures.py, one module per service."""

pytest_plugins = [
    "tests.support.service_fixtures",   # real sshd, real SLURM, fake nvidia-smi
    "tests.support.prefect_fixtures",   # one real Prefect API for the session
    "tests.support.remote_host",        # the tiny model where the ssh user can read it
    "tests.support.potato212",          # the real potato-annotation 2.12.1, in its own venv
    "tests.support.llm_tasks",          # tiny causal LMs (Llama, GPT-2) and the tasks they learn
]
