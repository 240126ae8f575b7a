"""The README, the documentation site and the benchmarks index stay honest
where that is cheap to check: the README stays short and names only commands
and paths that exist, every command has its page, the site's navigation and
its pages agree, and every benchmark script and result folder is indexed.

(``scripts/test.sh`` builds the site with ``mkdocs build --strict`` too, which
checks every link and anchor; this file needs no MkDocs.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from qtune.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCH = ROOT / "benchmarks"
# "at most about 250 lines" (issue 29); a little slack for a sample to refresh
README_MAX_LINES = 260
# Top-level folders and files a README path may start with.
REPO_PATH = re.compile(r"^(?:benchmarks|docs|examples|scripts|tests|qtune|profiles|studies)/"
                       r"[\w./*-]*$|^(?:mkdocs\.yml|pyproject\.toml|\.ci/run)$")


def commands() -> set[str]:
    return set(typer.main.get_command(app).commands)  # a click Group: its commands by name


def code_text(markdown: str) -> str:
    """The fenced blocks (less their shell comments) and inline code spans of
    a Markdown text."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.M | re.S)
    commands = [re.sub(r"(^|\s)#.*$", "", line) for b in blocks for line in b.splitlines()]
    outside = re.sub(r"^```[^\n]*\n.*?^```", "", markdown, flags=re.M | re.S)
    return "\n".join(commands + re.findall(r"`([^`\n]+)`", outside))


# `qtune CMD` where a command starts: a line's start (after VAR=value
# assignments), a venv's bin/, or after ; && |
COMMAND = re.compile(r"(?:^\s*(?:\w+=\S+\s+)*|bin/|[;&|]\s*)qtune ([a-z][a-z-]*)", re.M)


def named_commands(markdown: str) -> set[str]:
    return set(COMMAND.findall(code_text(markdown)))


def nav_files(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in nav_files(item)]
    if isinstance(nav, dict):
        return [f for v in nav.values() for f in nav_files(v)]
    return []


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the detail to docs/")


def test_readme_names_only_commands_that_exist():
    named = named_commands(README.read_text())
    assert named, "the README names no qtune command"
    assert named <= commands(), f"the README names commands qtune lacks: {named - commands()}"


def test_readme_keeps_the_two_commands():
    text = README.read_text()
    for command in ("bash scripts/quickstart.sh", "bash scripts/test.sh"):
        assert command in text
        assert (ROOT / command.split()[1]).is_file()


def test_readme_paths_exist():
    missing = []
    for token in re.findall(r"`([^`\s]+)`", README.read_text()):
        path = token.rstrip(".,;:")
        if REPO_PATH.match(path) and not list(ROOT.glob(path)):
            missing.append(path)
    assert not missing, f"the README names paths that do not exist: {missing}"


def test_every_command_has_a_page_and_the_pages_name_real_commands():
    pages = {p.stem for p in (DOCS / "commands").glob("*.md")}
    assert commands() <= pages, f"commands without a page: {commands() - pages}"
    assert pages <= commands(), f"pages for commands qtune lacks: {pages - commands()}"
    for page in DOCS.rglob("*.md"):
        named = named_commands(page.read_text())
        assert named <= commands(), f"{page}: names commands qtune lacks: {named - commands()}"


def test_the_site_navigation_and_its_pages_agree():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = nav_files(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the navigation twice"
    missing = [f for f in nav if not (DOCS / f).is_file()]
    assert not missing, f"mkdocs.yml names pages that do not exist: {missing}"
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == set(nav), f"pages left out of the navigation: {pages - set(nav)}"


def test_every_benchmark_script_is_indexed():
    index = (BENCH / "README.md").read_text()
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    unnamed = sorted(s for s in scripts if f"`{s}`" not in index)
    assert not unnamed, f"benchmarks/README.md does not name: {unnamed}"
    named = set(re.findall(r"`(\w+\.py)`", index))
    recipes = {p.name for p in (BENCH / "gpu-h200" / "recipes").iterdir()}
    ghosts = sorted(n for n in named if n not in scripts and n not in recipes)
    assert not ghosts, f"benchmarks/README.md names scripts that do not exist: {ghosts}"


def test_every_result_folder_has_a_readme():
    folders = [*(BENCH / "results").iterdir(), *(BENCH / "gpu-h200").glob("run*")]
    bare = sorted(str(f.relative_to(ROOT)) for f in folders
                  if f.is_dir() and not (f / "README.md").is_file())
    assert not bare, f"result folders without a README: {bare}"


def test_no_generated_page_is_committed():
    try:
        tracked = subprocess.run(["git", "ls-files", "benchmarks"], cwd=ROOT, text=True,
                                 capture_output=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    html = [p for p in tracked if p.endswith(".html")]
    assert not html, f"generated pages are committed (rebuild_reports.py makes them): {html}"


def test_the_generated_pages_rebuild_from_the_committed_data():
    out = subprocess.run([sys.executable, str(BENCH / "rebuild_reports.py"), "--check"],
                         cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("built ") >= 1
