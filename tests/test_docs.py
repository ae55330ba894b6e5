"""README.md, the top folders' README.md and docs/*.md name only repository paths, make targets and command-line
flags that exist.

What is checked, and where it is looked for:

- **Paths.** (a) Anywhere in a doc (prose, inline code, code blocks), a token that starts a word with one of the
  repository's top-level entries and `/` (`ipam_provider/watch.py`, `hack/versions.env`, `config/default`) must
  exist from the repository root; with a trailing `/` it must be a directory. (b) In inline code and code blocks, a
  token with `/` whose first part is no top-level entry, ending in `/` or one of `CHECKED_SUFFIXES`
  (`runtime/workqueue.py`), must be the end of an existing path; a bare file name with one of those suffixes
  (`claims.py`) must be some file's name. (c) A relative link target (`[x](repair.md#anchor)`) must exist from the
  doc's directory. Placeholders stand for any one path part: `<name>`, `*`, and `{a,b}` alternatives. Not checked:
  what the commands make or cache (`NOT_IN_TREE`: `.local/`, `out/`), files of the standard library and installed
  dependencies (`asyncio/base_events.py` in a profile), other trees' paths in `ELSEWHERE`, and paths outside the
  work tree (`~/.cache/...`, `/tmp/...`, `$PWD/...`), which never start a word with a top-level entry.
- **Make targets.** In inline code and code blocks, the words after `make` (options and `VAR=value` skipped) up to
  the end of the command must be targets of the Makefile.
- **Flags.** Only where the flag is certainly ours: (a) a command line of ours in inline code or a code block, from
  `ipam-provider` to the end of the line (in a code block, with its `\\`-continued and indented lines), checked
  against the flags of the command it runs (`ipam-provider`, `ipam-provider run`, `ipam-provider status`); (b) the
  first column of the tables of `FLAG_DOCS`. Flags of other tools (kubectl, clusterctl, pytest, the Go provider)
  appear elsewhere and are not checked against ours. `--<kind>-concurrency` is checked as `run` takes it
  (`take_kind_concurrency`), a placeholder `<...>` in a flag with a sample kind.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import re
import sys
import sysconfig
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from ipam_provider.flags import CLAIM_KIND, build_parser
from ipam_provider.runtime.flagforms import take_kind_concurrency

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted(REPO.glob("*/README.md")), *sorted((REPO / "docs").glob("*.md"))]
FLAG_DOCS = ("docs/running.md", "docs/flags.md")
CHECKED_SUFFIXES = (".py", ".md", ".sh", ".toml")
# What the commands make, or caches: named by docs, never in a clone.
NOT_IN_TREE = frozenset({".git", ".venv", ".local", "out", "__pycache__", ".mypy_cache", ".ruff_cache", ".hypothesis"})
ELSEWHERE = {  # paths of other trees that the docs name, and where they are (installed modules: `installed`)
    "root/conf/configuration.py": "the test NetBox's own tree, in its cache directory",
    "config/crd/bases": "a Go module's CRDs (the Go provider's, CAPMOX's)",
}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH_CHARS = r"(?:\{[\w.,-]+\}|<[^<>\n]*>|[\w./*@-])+"
_TOKEN_START = r"(?:(?<=^)|(?<=[\s(\[`'\"=,|]))"
_MAKE = re.compile(r"(?<![\w$/.-])make((?:[ \t]+[^\s;&|#)`]+)+)")
_COMMAND = re.compile(r"(?<![\w/.$-])ipam-provider(?![\w/.-])([^\n]*)")
_FLAG = re.compile(r"(?<![\w-])--[a-z0-9<][\w.<>-]*")


def segments(text: str) -> Iterator[tuple[str, str]]:
    """A doc's ("code", block), ("inline", span) and ("link", target) parts, and ("all", the whole text)."""
    yield "all", text
    for block in _FENCE.finditer(text):
        yield "code", block.group(1)
    for span in _INLINE.finditer(_FENCE.sub("", text)):
        yield "inline", span.group(2)
    for link in _LINK.finditer(text):
        yield "link", link.group(1)


@cache
def tree() -> tuple[str, ...]:
    """Every file and directory of the work tree, relative and in `/` form; directories end in `/`."""
    entries: list[str] = []
    stack = [REPO]
    while stack:
        directory = stack.pop()
        for child in directory.iterdir():
            if child.name in NOT_IN_TREE or child.name.endswith(".egg-info"):
                continue
            relative = child.relative_to(REPO).as_posix()
            if child.is_dir() and not child.is_symlink():
                entries.append(relative + "/")
                stack.append(child)
            else:
                entries.append(relative)
    return tuple(sorted(entries))


@cache
def top_level() -> frozenset[str]:
    return frozenset(entry.rstrip("/") for entry in tree() if "/" not in entry.rstrip("/"))


def patterns(token: str) -> list[str]:
    """The glob patterns a doc's path stands for: `<x>` is `*`, `{a,b}` two patterns."""
    token = re.sub(r"<[^>/]*>", "*", token)
    parts = re.split(r"\{([^}]*)\}", token)
    choices = [part.split(",") if index % 2 else [part] for index, part in enumerate(parts)]
    return ["".join(choice) for choice in itertools.product(*choices)]


def matches(pattern: str, entries: tuple[str, ...], *, suffix: bool = False) -> bool:
    """Whether some entry is `pattern` (with a trailing `/`, a directory; without, a file or a directory), or with
    `suffix` ends with `/pattern` (a bare name: is some entry's name)."""
    for entry in entries:
        if pattern.endswith("/") and not entry.endswith("/"):
            continue
        parts = entry.rstrip("/").split("/")
        candidate = "/".join(parts[-pattern.rstrip("/").count("/") - 1 :] if suffix else parts)
        if fnmatch.fnmatchcase(candidate, pattern.rstrip("/")):
            return True
    return False


def missing_paths(doc: Path) -> Iterator[str]:
    """The paths `doc` names that do not exist, by the rules in the module docstring."""
    top = "|".join(re.escape(name) for name in sorted(top_level(), key=len, reverse=True))
    rooted = re.compile(rf"{_TOKEN_START}(?:{top})/(?:{_PATH_CHARS})?")
    other = re.compile(rf"{_TOKEN_START}[\w.]{_PATH_CHARS}")
    for kind, text in segments(doc.read_text()):
        if kind == "link":
            target = text.split("#", 1)[0]
            if target and not re.match(r"[a-z]+:", target) and not (doc.parent / target).exists():
                yield f"link {text}"
            continue
        for token in rooted.findall(text) if kind == "all" else []:
            token = token.rstrip(".-")
            if token not in ELSEWHERE and not any(matches(pattern, tree()) for pattern in patterns(token)):
                yield token
        for token in other.findall(text) if kind in ("code", "inline") else []:
            token = token.rstrip(".-")
            first, slash, _ = token.rstrip("/").partition("/")
            if first in top_level() | NOT_IN_TREE or token in ELSEWHERE or installed(first.removesuffix(".py")):
                continue
            checked = token.endswith(CHECKED_SUFFIXES) or (slash and token.endswith("/"))
            if checked and not any(matches(pattern, tree(), suffix=True) for pattern in patterns(token)):
                yield token


@cache
def installed(name: str) -> bool:
    """Whether `name` is a module of the standard library or of an installed dependency, whose files a doc may
    quote (`asyncio/base_events.py` in a profile)."""
    libraries = {Path(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    found = any((library / file).exists() for library in libraries for file in (name, f"{name}.py"))
    return name in sys.stdlib_module_names or found


@cache
def makefile_targets() -> frozenset[str]:
    text = (REPO / "Makefile").read_text()
    return frozenset(re.findall(r"^([A-Za-z0-9][\w.-]*)[ \t]*:(?!=)", text, re.MULTILINE))


def missing_targets(doc: Path) -> Iterator[str]:
    for kind, text in segments(doc.read_text()):
        if kind not in ("code", "inline"):
            continue
        for words in _MAKE.findall(text):
            for word in words.split():
                if word.startswith("-") or "=" in word:
                    continue
                if not re.fullmatch(r"[a-z][\w.-]*", word):
                    break  # the command's end: a path, a placeholder, prose
                if word not in makefile_targets():
                    yield f"make {word}"


@cache
def our_flags() -> dict[str, frozenset[str]]:
    """The long flags of `ipam-provider` and of each of its commands."""
    parser = build_parser()
    flags = {"": frozenset(s for a in parser._actions for s in a.option_strings)}
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        flags[name] = frozenset(s for a in command._actions for s in a.option_strings)
    return flags


def accepted(flag: str, command: str) -> bool:
    flag = re.sub(r"<[^>]*>", "inclusterippool", flag)
    if flag in our_flags()[command]:
        return True
    rest, others = take_kind_concurrency([command, f"{flag}=1"], CLAIM_KIND) if command == "run" else ([], {})
    return bool(others) or (len(rest) == 2 and rest[1] in our_flags()["run"] and rest[1] != flag)


def command_lines(text: str, kind: str) -> Iterator[str]:
    """Our command lines in a code block (each with its continued lines) or an inline span."""
    lines = text.splitlines() or [""]
    for index, line in enumerate(lines):
        match = _COMMAND.search(line)
        if match is None or (kind == "code" and "#" in line[: match.start()]):
            continue
        command = match.group(1)
        for following in lines[index + 1 :] if kind == "code" else []:
            if not (command.rstrip().endswith("\\") or following[:1].isspace()) or _COMMAND.search(following):
                break
            command += " " + following
        yield command.split(" #", 1)[0]


def unknown_flags(doc: Path) -> Iterator[str]:
    """Flags of our command lines, and in the first column of FLAG_DOCS' tables, that our parser does not take."""
    for kind, text in segments(doc.read_text()):
        for line in command_lines(text, kind) if kind in ("code", "inline") else []:
            words = line.split()
            command = words[0] if words and words[0] in our_flags() else ""
            yield from (flag for flag in _FLAG.findall(line) if not accepted(flag.rstrip("."), command))
    if doc.relative_to(REPO).as_posix() in FLAG_DOCS:
        for row in re.findall(r"^\|([^|\n]*(?:\\\|[^|\n]*)*)\|", doc.read_text(), re.MULTILINE):
            for span in _INLINE.findall(row):
                yield from (flag for flag in _FLAG.findall(span[1]) if not accepted(flag, "run"))


@pytest.mark.parametrize("doc", DOCS, ids=[doc.relative_to(REPO).as_posix() for doc in DOCS])
def test_the_doc_names_only_what_exists(doc: Path) -> None:
    problems = {
        "paths that do not exist": sorted(set(missing_paths(doc))),
        "make targets the Makefile does not have": sorted(set(missing_targets(doc))),
        "flags ipam-provider does not take": sorted(set(unknown_flags(doc))),
    }
    problems = {what: names for what, names in problems.items() if names}
    assert not problems, f"{doc.relative_to(REPO)} names {problems}"


def test_the_checks_find_what_they_look_for() -> None:
    """The extraction sees the forms the docs use, so that a check that finds nothing means something."""
    running = (REPO / "docs" / "running.md").read_text()
    assert "--webhook-cert-dir" in {f for k, t in segments(running) for f in _FLAG.findall(t) if k == "inline"}
    assert list(command_lines("ipam-provider run --workers 8 \\\n  --v 2\nkubectl get pods", "code")) == [
        " run --workers 8 \\   --v 2"
    ]
    assert list(_MAKE.findall("RUN_ONCE=1 make run")) == [" run"]
    assert not matches("ipam_provider/watch/", tree()) and matches("ipam_provider/watch.py", tree())
    assert matches("runtime/workqueue.py", tree(), suffix=True) and matches("claims.py", tree(), suffix=True)
    assert patterns("backends/{netbox,infoblox}/<x>.py") == ["backends/netbox/*.py", "backends/infoblox/*.py"]
