"""The commands and links the README and docs/ show are ones that work.

A reader copies a `potato …` line from a page and expects it to run; a flag
renamed in potato/cli.py would otherwise leave the page wrong without any
test noticing. Only parsing is checked (nothing is run), so the pages'
placeholders (config.yaml, run 7, a repo name) are fine as they are.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from potato.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```(\w*)\s*$")
SHELL_FENCES = {"", "sh", "bash", "console", "shell"}
# Only this project's own command: ~/potato-2.12/bin/potato is Potato 2.12's, whose options differ.
OURS = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S* )*(?:\.venv/bin/)?potato (.*)$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def shell_lines(page: Path) -> list[tuple[int, str]]:
    """Each line of the page's shell code blocks, with its line number; a line ending in \\ joins the next."""
    found, fence, pending = [], None, None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        opening = FENCE.match(line)
        if opening and fence is None:
            fence = opening.group(1)
            continue
        if line.strip() == "```" and fence is not None:
            fence, pending = None, None
            continue
        if fence not in SHELL_FENCES:
            continue
        text = line.strip()
        if pending is not None:
            start, text = pending[0], pending[1] + " " + text
        else:
            start = number
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        found.append((start, text))
    return found


def potato_args(line: str) -> list[str] | None:
    """The arguments after `potato` when the line invokes this project's command, else None."""
    invocation = OURS.match(line)
    if invocation is None:
        return None
    words = shlex.split(invocation.group(1), comments=True)
    # What follows a shell operator (`&` to background it, a pipe) is not potato's to parse.
    for i, word in enumerate(words):
        if word in {"&", "&&", "||", "|", ";", ">", ">>", "2>&1"}:
            words = words[:i]
            break
    # A page's synopsis marks optional parts as [--flag value]: they must parse when given.
    return [w.strip("[]") if w.startswith("[") or w.endswith("]") else w for w in words]


def parse_error(args: list[str]) -> str | None:
    """Why the command line would not parse, or None when it parses down to a command that runs."""
    command, parent, name = main, None, "potato"
    while True:
        try:
            ctx = command.make_context(name, list(args), parent=parent, resilient_parsing=False)
        except click.exceptions.NoArgsIsHelpError:
            return f"'{name}' needs a subcommand"
        except click.BadParameter as exc:
            # An existing-file check on a placeholder path is about the reader's machine, not the page.
            if exc.param is not None and isinstance(exc.param.type, click.Path) and "does not exist" in str(exc):
                return None
            return exc.format_message()
        except click.exceptions.Exit:
            return None  # --help or --version: they end parsing by design
        except click.UsageError as exc:
            return exc.format_message()
        if not isinstance(command, click.Group):
            return None
        # A group keeps its subcommand's name apart from the rest; click 8.2 renamed where.
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
        rest = [*protected, *ctx.args]
        if not rest:
            return f"'{name}' needs a subcommand"
        try:
            name, command, args = command.resolve_command(ctx, rest)
        except click.UsageError as exc:
            return exc.format_message()
        parent = ctx


def command_problems(pages: list[Path], root: Path = ROOT) -> list[str]:
    problems = []
    for page in pages:
        for number, line in shell_lines(page):
            try:
                args = potato_args(line)
            except ValueError as exc:  # shlex: an unclosed quote
                args, error = [], str(exc)
            else:
                error = None if args is None else parse_error(args)
            if error:
                problems.append(f"{page.relative_to(root)}:{number}: {line}\n    {error}")
    return problems


def test_every_potato_command_the_pages_show_parses_against_the_real_cli():
    assert command_problems(PAGES) == []


def test_the_pages_show_potato_commands_at_all():
    # Without this a change to the fence or prompt rules could check nothing and pass.
    shown = [line for page in PAGES for _, line in shell_lines(page) if potato_args(line) is not None]
    assert len(shown) >= 10


@pytest.mark.parametrize(("line", "why"), [
    ("potato training run config.yaml --no-such-flag", "No such option '--no-such-flag'"),
    ("$ potato training config.yaml", "No such command 'config.yaml'"),
    ("potato training", "'training' needs a subcommand"),
    ("potato trainig runs config.yaml", "No such command 'trainig'"),
    ("potato training cancel config.yaml", "Missing argument 'RUN_ID'"),
])
def test_a_made_up_flag_or_a_missing_subcommand_is_reported_with_its_file_and_line(tmp_path, line, why):
    page = tmp_path / "page.md"
    page.write_text(f"Some prose.\n\n```sh\n{line}   # a comment\n```\n", encoding="utf-8")
    problems = command_problems([page], root=tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"page.md:4: {line}") and why in problems[0]


def test_a_placeholder_run_and_a_synopsis_of_optional_flags_parse():
    assert parse_error(potato_args("potato training cancel config.yaml 7  # run 7")) is None
    assert parse_error(potato_args(
        'potato training publish config.yaml 7 --repo a/b [--public] [--revision main] [--message "…"]')) is None
    assert potato_args("~/potato-2.12/bin/potato start config.yaml -p 8000") is None


def relative_links(page: Path) -> list[tuple[int, str]]:
    found, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if not re.match(r"^(https?:|mailto:|#)", target):
                found.append((number, target))
    return found


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    # A link is relative to the page that holds it: docs/ pages link their siblings without docs/.
    return [f"{page.relative_to(root)}:{number}: {target}"
            for page in pages for number, target in relative_links(page)
            if not (page.parent / target.split("#", 1)[0]).exists()]


def test_every_relative_link_in_the_pages_points_at_a_file_that_exists():
    assert broken_links(PAGES) == []


def test_a_link_written_from_the_wrong_directory_is_reported_and_web_links_are_not_checked(tmp_path):
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "other.md").write_text("# Other\n", encoding="utf-8")
    page = tmp_path / "guide" / "page.md"
    page.write_text("[ok](other.md#a-part), [wrong](guide/other.md), [web](https://example.org/x.md), "
                    "[here](#top)\n\n```sh\n[not a link](in-code.md)\n```\n", encoding="utf-8")
    assert broken_links([page], root=tmp_path) == ["guide/page.md:1: guide/other.md"]
