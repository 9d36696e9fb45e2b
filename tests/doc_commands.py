"""The dtrain commands of README.md and docs/*.md, read the way tests/unit/test_docs.py and
tests/launch/test_docs_launch.py run them.

- ```bash / ```sh / plain blocks: every line that starts with ``dtrain`` (after optional
  ``VAR=value`` words) is a command; ``cd DIR`` applies to the lines after it; ``\\`` joins
  lines; ``  # ...`` is a comment; ``> file`` / ``< file`` end the arguments.
- ```console blocks: ``$ dtrain ...`` lines are commands and the lines after them what
  dtrain prints (an ``error:`` line means exit code 2; ``...`` stands for any text).
- ```text / ```yaml / ```python blocks are not commands.

Lines that name the reader's own files, hosts or runs (``runs/<run>``, ``/models/...``,
``node0``) are placeholders: tests/launch/test_docs_launch.py runs the ``runs/<run>`` ones
against a run it made; the others cannot run here and are listed in PLACEHOLDERS.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What a reader substitutes: their runs, model folders, corpora, hosts, sites and scripts.
RUN = "runs/<run>"
PLACEHOLDERS = (
    *("/models/", "corpus.jsonl", "shards/", "data.path=notes/", "data.path=tokens/"),
    *("my_data.", "node0", "my_conf", "/path/to/", " train.py", "mypkg."),
)
# Commands that start processes or need a live cluster: never run by the doc tests.
NOT_RUN = {
    "validate-cluster": "starts ranks for its live check (tests/launch/test_cluster_live.py)",
    "agent": "runs a SLURM job's node (tests/launch/test_slurm.py)",
    "simulate": "starts a process per simulated rank; the guide's layouts are simulated in "
    "tests/launch/test_simulate.py",
    "--install-completion": "writes to the user's shell start-up file (Typer's own); what it "
    "completes: tests/unit/test_overrides.py (test_completion_offers_recipes_options_and_keys)",
}
SHELL_BLOCKS = ("", "bash", "sh", "shell")


@dataclass(frozen=True)
class Command:
    file: str
    """Path relative to the repository."""
    line: int
    cwd: str
    """``.`` or the folder a ``cd`` line moved to."""
    argv: tuple[str, ...]
    """After ``dtrain``."""
    expected: tuple[str, ...] | None = None
    """A console block's printed lines; None in a shell block."""
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def text(self) -> str:
        return " ".join(self.argv)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def placeholder(self) -> bool:
        line = " " + self.text
        return any(p in line for p in (*PLACEHOLDERS, RUN, "runs/<other-run>"))


def doc_files() -> list[Path]:
    """The top-level *.md files and docs/*.md."""
    return sorted([*REPO.glob("*.md"), *(REPO / "docs").glob("*.md")])


BLOCK_RE = re.compile(r"^ *```([\w-]*)\n(.*?)^ *```", re.S | re.M)


def doc_commands(files: list[Path] | None = None) -> list[Command]:
    out: list[Command] = []
    for path in files or doc_files():
        text = path.read_text()
        rel = str(path.relative_to(REPO))
        for m in BLOCK_RE.finditer(text):
            lang, body = m.group(1), m.group(2)
            first = text.count("\n", 0, m.start(2)) + 1
            if lang == "console":
                out += _console(rel, first, body)
            elif lang in SHELL_BLOCKS:
                out += _shell(rel, first, body)
    return out


def _words(line: str) -> tuple[list[tuple[str, str]], list[str]] | None:
    """(env, argv after dtrain) of one command line, or None if it does not run dtrain."""
    words = shlex.split(line)
    env = []
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, _, value = words.pop(0).partition("=")
        env.append((key, value))
    if not words or words[0] != "dtrain":
        return None
    argv = words[1:]
    for i, w in enumerate(argv):
        if w in (">", "<", ">>", "|", "2>&1"):
            argv = argv[:i]
            break
    return env, argv


def _shell(file: str, first: int, body: str) -> list[Command]:
    out, cwd = [], "."
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        line = line.split("  #")[0].strip()
        if line.startswith("cd "):
            cwd = line[3:].strip()
        elif (parsed := _words(line)) is not None:
            env, argv = parsed
            out.append(Command(file, first + start, cwd, tuple(argv), None, tuple(env)))
    return out


def _console(file: str, first: int, body: str) -> list[Command]:
    out: list[Command] = []
    cwd = "."
    for n, line in enumerate(body.splitlines()):
        if line.startswith("$ "):
            cmd = line[2:].split("  #")[0].strip()
            if cmd.startswith("cd "):
                cwd = cmd[3:].strip()
            elif (parsed := _words(cmd)) is not None:
                env, argv = parsed
                out.append(Command(file, first + n, cwd, tuple(argv), (), tuple(env)))
        elif out and out[-1].expected is not None and line.strip():
            last = out[-1]
            out[-1] = Command(
                last.file, last.line, last.cwd, last.argv, (*last.expected, line.strip()), last.env
            )
    return out


def matches(expected: str, printed: str) -> bool:
    """``expected`` with ``...`` standing for any text."""
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed) is not None


LINK_RE = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link outside code blocks and code spans."""
    text = BLOCK_RE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK_RE.finditer(text)]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings."""
    text = BLOCK_RE.sub("", path.read_text())
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out
