"""A real Prefect API shared by the whole test session."""
