"""Where configs and recipes are found: the built-in folders (in the wheel or the repo),
the user's (``--config-dir``, ``$DTRAIN_CONFIG_PATH``), Hydra's search path, the recipes
and the options of every config group. Torch-free, Hydra-free."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dtrain_cli.errors import ConfigError
from dtrain_cli.rundir import env


def _package_dir(name: str) -> Path:
    """``configs``/``recipes``: inside the wheel (``dtrain_cli/_data``) or at the repo root."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "_data" / name, here.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"dtrain's built-in '{name}' folder is missing (looked beside {here})")


def builtin_configs_dir() -> Path:
    return _package_dir("configs")


def builtin_recipes_dir() -> Path:
    return _package_dir("recipes")


def user_config_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    dirs = [Path(d) for d in extra]
    dirs += [Path(d) for d in env.config_path()]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise ConfigError([f"config dir {m!r} does not exist" for m in missing])
    return [d.resolve() for d in dirs]


def recipe_dirs(extra: Sequence[str | Path] = ()) -> list[Path]:
    """Where recipes are looked up, first match wins: each user folder's recipes/ and the
    folder itself (``--config-dir conf`` with ``conf/my_experiment.yaml``), then built-in."""
    dirs = []
    for d in user_config_dirs(extra):
        dirs += [d / "recipes"] if (d / "recipes").is_dir() else []
        dirs.append(d)
    return [*dirs, builtin_recipes_dir()]


def list_recipes(extra: Sequence[str | Path] = ()) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for d in reversed(recipe_dirs(extra)):
        for p in sorted(d.glob("*.yaml")):
            found[p.stem] = p
    return dict(sorted(found.items()))


def recipe_description(path: Path) -> str:
    """The first sentence of the recipe's header comment, after its command and examples
    (a sentence may run on over the next comment lines)."""
    words: list[str] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:  # listed, with what is wrong, not a traceback
        return f"(not UTF-8 text: byte {exc.start}; save it as UTF-8)"
    for line in text.splitlines():
        text = line.lstrip("#").strip() if line.startswith("#") else ""
        if not text:
            if words or not line.startswith("#"):
                break
            continue
        if not words and text.startswith(("dtrain ", "e.g.", "@package")):
            continue
        words.append(text)
        joined = " ".join(words)
        end = _sentence_end(joined)
        if end:
            return joined[:end]
    return " ".join(words)


def _sentence_end(text: str) -> int:
    """Where the first sentence of ``text`` ends (after its '.'), or 0 if it goes on."""
    for i, ch in enumerate(text):
        if (
            ch == "."
            and (i + 1 == len(text) or text[i + 1] == " ")
            and not text[:i].endswith("e.g")
        ):
            return i + 1
    return 0


RESERVED = ("base", "dtrain_schema")
"""dtrain's own config names: every recipe's defaults list begins with ``base``, which a
user file of that name would shadow (a recipe named base then composed itself forever)."""


def reserved_problems(config_dirs: Sequence[str | Path] = ()) -> list[str]:
    """A file in the user's folders (or their recipes/) that shadows :data:`RESERVED`."""
    out = []
    for d in user_config_dirs(config_dirs):
        for folder in (d, d / "recipes"):
            for name in RESERVED:
                if (folder / f"{name}.yaml").is_file():
                    out.append(
                        f"{folder / name}.yaml: {name!r} is dtrain's own config (every "
                        f"recipe's defaults begin with base); rename it, e.g. team_{name}.yaml"
                    )
    return out


def search_path(config_dirs: Sequence[str | Path] = ()) -> list[Path]:
    """Hydra's search path: the user's folders (and their recipes/), then the built-in."""
    user_dirs = user_config_dirs(config_dirs)
    search = [*user_dirs, *(d / "recipes" for d in user_dirs), builtin_configs_dir()]
    return [d for d in search if d.is_dir()]


def group_options(config_dirs: Sequence[str | Path] = ()) -> dict[str, list[str]]:
    """Every config group (a folder of YAML options) -> its options, built-in and the user's."""
    found: dict[str, set[str]] = {}
    for d in [*user_config_dirs(config_dirs), builtin_configs_dir()]:
        for sub in d.iterdir():
            if sub.is_dir() and sub.name != "recipes":
                opts = {p.stem for p in sub.glob("*.yaml")}
                if opts:
                    found.setdefault(sub.name, set()).update(opts)
    return {g: sorted(o) for g, o in sorted(found.items())}
