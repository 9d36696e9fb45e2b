"""Help pages kept on disk: ``dtrain --help`` (and ``dtrain COMMAND --help``) printed again
from the text Typer rendered the last time, without importing Typer, rich or any command.

    <cache>/help/<key>.txt   # <cache>: $DTRAIN_CACHE or ~/.cache/dtrain

Importing Typer, click, rich and dtrain's command modules is most of ``dtrain --help``'s
time (about 0.11 of its 0.17 s on 2 cores, bench/RESULTS.md "CLI latency"); the page itself
is a pure function of what the key names: the words asked for, dtrain's source files and
the installed Typer, click and rich (by file stats, as the kept compositions of
:mod:`dtrain_cli.config.compose_cache`), the Python version, and everything that changes how
rich lays it out: whether stdout is a terminal, its size and encoding, and the environment
variables rich and Typer read (``COLUMNS``, ``TERM``, ``NO_COLOR``, ``FORCE_COLOR``...). So
an edit of dtrain's code, a resized terminal or ``NO_COLOR=1`` renders the page again.

Only a page that ended with exit code 0, wrote nothing to stderr and asked for nothing but
command words and ``--help``/``-h`` is kept. Reading or writing never fails a command: an
unreadable entry is a miss (the page is rendered as before), a write that fails is skipped;
``DTRAIN_CACHE=/dev/null`` keeps nothing. Imports neither Typer nor torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from dtrain_cli.kept import write_entry
from dtrain_cli.rundir import env
from dtrain_cli.source_stats import code_files, package_files, stats

FOLDER = "help"
KEEP = 64  # pages; the oldest go first (one is about 3 KB)
HELP_FLAGS = ("--help", "-h")
WORD = re.compile(r"[a-z][a-z0-9-]*\Z")
LAYOUT_ENV = re.compile(
    r"(COLUMNS|LINES|TERM|COLORTERM|NO_COLOR|FORCE_COLOR|TTY_COMPATIBLE|TTY_INTERACTIVE"
    r"|TERMINAL_WIDTH|JUPYTER_COLUMNS|JUPYTER_LINES|PYTHONIOENCODING|LANG|LC_ALL|LC_CTYPE"
    r"|_?TYPER_.*|CLICOLOR.*|DTRAIN_.*)\Z"
)
"""Environment variables that change the page (rich's and Typer's console settings, the
locale's encoding) or what dtrain registers; ``DTRAIN_CACHE`` itself is left out."""


def is_help_request(argv: Sequence[str]) -> bool:
    """``dtrain --help``, ``dtrain plan -h``, ``dtrain k8s submit --help``: command words,
    then one help flag, nothing else."""
    return bool(argv) and argv[-1] in HELP_FLAGS and all(WORD.match(w) for w in argv[:-1])


def _terminal() -> list[object]:
    out: list[object] = []
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            out.append((os.isatty(fd), tuple(os.get_terminal_size(fd))))
        except (AttributeError, OSError, ValueError):
            out.append(None)
    out.append(getattr(sys.stdout, "encoding", None))
    return out


def key_for(argv: Sequence[str]) -> str | None:
    """The page's key, or None when the command is not a help request."""
    if not is_help_request(argv):
        return None
    # argv[0]: `dtrain` and `python -m dtrain_cli` print their own names in the page
    parts: list[object] = [sys.version, sys.argv[0], list(argv), _terminal()]
    parts += sorted((k, v) for k, v in os.environ.items() if LAYOUT_ENV.match(k) and k != env.CACHE)
    parts += stats(code_files())
    parts += stats(package_files(("typer", "click", "rich")))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def cache_dir() -> Path:
    return (env.cache_root() or Path.home() / ".cache" / "dtrain") / FOLDER


def serve(key: str | None) -> bool:
    """Print the page kept under ``key`` (:func:`key_for`); False (nothing printed) when
    there is none."""
    if key is None:
        return False
    try:
        text = (cache_dir() / f"{key}.txt").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    sys.stdout.write(text)
    sys.stdout.flush()
    return True


class _Recorder:
    """Stands in for a stream: writes go through and are kept; everything else (``isatty``,
    ``fileno``, ``encoding``: what rich asks to lay out the page) is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        written = self._stream.write(text)  # click probes with write(b""): TypeError, not kept
        self.parts.append(text)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def recording(key: str | None) -> Iterator[None]:
    """Run the command; when it was a help request (``key``: :func:`key_for`) that exited 0
    with nothing on stderr, keep what it printed."""
    if key is None:
        yield
        return
    out, err = _Recorder(sys.stdout), _Recorder(sys.stderr)
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    code: object = 0
    try:
        yield
    except SystemExit as exc:
        code = exc.code
        raise
    except BaseException:  # a page cut short by an error is not kept
        code = 1
        raise
    finally:
        sys.stdout, sys.stderr = out._stream, err._stream
        if code in (0, None) and not any(err.parts) and out.parts:
            _store(key, "".join(out.parts))


def _store(key: str, text: str) -> None:
    write_entry(cache_dir(), f"{key}.txt", text.encode("utf-8"), KEEP)
