"""``data=custom``: your own map-style dataset, built from ``data._target_``.

    dtrain launch data=custom data._target_=my_data.Pairs ++data.n=512 train.loss=mse

The target (a class or a function) is called with the other ``data.*`` keys as keyword
arguments, Hydra ``instantiate`` semantics (nested ``_target_`` allowed, every one checked by
:func:`dtrain_cli.config.data_checks.target_problems` first: it imports and is not the
standard library). Items are ``(inputs, targets)`` or a dict of tensors, and should depend
only on the index: the global sample stream picks indices, so every layout and any number of
loader workers see the same samples. Validation: ``data.val_target`` (built with the same
arguments), or else the last ``data.val_fraction`` of the items.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dtrain_cli.config.data_checks import custom_arguments, target_problems
from dtrain_cli.config.schema import DataConfig
from dtrain_cli.errors import ConfigError
from dtrain_cli.targets import import_roots


class IndexRange:
    """Items ``start .. stop-1`` of a dataset, re-indexed from 0 (a picklable ``Subset``)."""

    def __init__(self, dataset: Any, start: int, stop: int) -> None:
        self.dataset, self.start, self.stop = dataset, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> Any:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.dataset[self.start + i]


def _one_line(exc: BaseException) -> str:
    while exc.__cause__ is not None:  # Hydra wraps the user's error
        exc = exc.__cause__
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _build(key: str, target: str, kwargs: dict[str, Any]) -> Any:
    from hydra.utils import instantiate

    try:
        return instantiate({"_target_": target, **kwargs}, _convert_="all")
    except Exception as exc:  # the user's constructor: report it on one line
        raise ConfigError(
            [f"{key}={target}: building the dataset failed: {_one_line(exc)}"]
        ) from None


def check_map_style(key: str, target: str, dataset: Any) -> None:
    """A dataset dtrain can index: ``__len__``, ``__getitem__``, items of a known form."""
    where = f"{key}={target}"
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        kind = type(dataset).__name__
        raise ConfigError(
            [
                f"{where}: built a {kind}, not a map-style dataset (__len__ and __getitem__); "
                "dtrain indexes samples so every layout sees the same ones (no IterableDataset)"
            ]
        )
    n = len(dataset)
    if n < 1:
        raise ConfigError([f"{where}: the dataset is empty"])
    item = dataset[0]
    pair = isinstance(item, (tuple, list)) and len(item) == 2
    if not (pair or isinstance(item, dict)):
        raise ConfigError(
            [
                f"{where}: item 0 is a {type(item).__name__}; items must be "
                "(inputs, targets) or a dict of tensors"
            ]
        )


def build_custom(data: DataConfig, roots: Sequence[str] = ()) -> dict[str, Any]:
    """train/val map-style datasets of ``data=custom``; ConfigError (one line) otherwise.
    ``roots``: where to import from before the current folder's (the run's
    ``run.import_roots``: a resume from another folder finds the run's modules)."""
    problems = target_problems(data, list(dict.fromkeys([*roots, *import_roots()])))
    if problems:
        raise ConfigError(problems)
    assert data._target_ is not None
    arguments = custom_arguments(data)
    train = _build("data._target_", data._target_, arguments)
    check_map_style("data._target_", data._target_, train)
    if data.val_target:
        val = _build("data.val_target", data.val_target, arguments)
        check_map_style("data.val_target", data.val_target, val)
        return {"train": train, "val": val}
    n = len(train)
    n_val = max(1, int(n * data.val_fraction))
    if n - n_val < 1:
        raise ConfigError(
            [
                f"data._target_={data._target_}: {n} items leave none for training after the "
                f"validation split (data.val_fraction={data.val_fraction}); set data.val_target"
            ]
        )
    return {"train": IndexRange(train, 0, n - n_val), "val": IndexRange(train, n - n_val, n)}
