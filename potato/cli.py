"""The ``potato`` command: validate, start, and the training commands.

Heavy modules (prefect, flask, torch) are imported inside the commands that
need them, so ``potato validate`` stays fast.
"""

from __future__ import annotations

import sys

import click


@click.group()
@click.version_option(package_name="potato-annotation")
def main() -> None:
    """Potato's model training."""


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--strict", is_flag=True, help="Fail on warnings too (acknowledged ones excepted).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def validate(config: str, strict: bool, as_json: bool) -> None:
    """Check CONFIG: errors exit 1; with --strict, unacknowledged warnings too."""
    from potato.validate import run_validate_command

    sys.exit(run_validate_command(config, strict=strict, as_json=as_json))


@main.group()
def training() -> None:
    """Run, follow, cancel and check training runs."""


if __name__ == "__main__":  # pragma: no cover
    main()
