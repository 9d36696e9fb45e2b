"""What the plan refuses of a model of your own from its config and from what its meta build
measured (``CustomSpec._measured``): nothing to train, token data without a window length,
pipeline stages that would leave a module, a buffer or a tied copy behind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtrain_cli.models.custom.stages import tied_problem, unstaged_problem

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig

SAMPLE_SOURCES = ("custom", "shapes")
"""``data.source`` values whose items are samples of their own, not token windows."""


def window_problems(target: str, kwargs: dict[str, Any], cfg: DtrainConfig) -> list[str]:
    """Token data cuts windows of ``model.block_size`` tokens: without it every rank
    stopped at start-up in the sample stream (``int // NoneType``); and dtrain reads it and
    ``model.vocab_size`` itself: ``block_size=64.5`` passed the plan and failed at start-up."""
    wrong = [
        f"model.{key}={kwargs[key]!r}: dtrain reads it as a whole number of "
        f"{'tokens (the window length)' if key == 'block_size' else 'token ids'}; give an "
        "integer of at least 1"
        for key in ("block_size", "vocab_size")
        if kwargs.get(key) is not None
        and (isinstance(kwargs[key], bool) or not isinstance(kwargs[key], int) or kwargs[key] < 1)
    ]
    if wrong:
        return wrong
    if cfg.data.source in SAMPLE_SOURCES or kwargs.get("block_size") is not None:
        return []
    cls = target.rsplit(".", 1)[-1]
    return [
        f"model.block_size: not set; data.source={cfg.data.source} cuts token windows of "
        f"model.block_size tokens, given to {cls} as its block_size argument: set "
        "model.block_size=N, or train on your own dataset with data=custom"
    ]


def measured_problems(
    target: str, measured: dict[str, Any], cfg: DtrainConfig, attr: str | None
) -> list[str]:
    out = []
    frozen, trainable = measured.get("frozen", 0), measured.get("trainable", 1)
    if not trainable:
        out.append(
            f"model._target_={target}: no parameter requires grad ({frozen:,} frozen): "
            "nothing would train; leave some trainable (requires_grad=True)"
        )
    if cfg.parallel.pp > 1 and (unstaged := measured.get("unstaged")):
        out.append(unstaged_problem(target, str(attr), unstaged))
    if cfg.parallel.pp > 1 and (tied := measured.get("tied")):
        out.append(tied_problem(attr, tied, cfg.parallel.pp))
    return out


def tied_unit_problems(owners: list[list[Any]], cfg: DtrainConfig) -> list[str]:
    """``parallel.fsdp_units`` that put the names of one tied parameter (a head tied to the
    embedding) in two FSDP groups: ``fully_shard`` refuses it at start-up ("shared with a
    parameter already managed by another FSDP group") after the plan passed. The default
    units leave a tied embedding and head to the root group together. ``owners``:
    :func:`.stages.tied_owners`, recorded with the model's facts. Asked by the plan where
    the strategy shards parameters (:meth:`ModelSpec.sharding_problems`)."""
    given = list(cfg.parallel.fsdp_units or [])
    units = set(given)
    if not units:
        return []
    for group in owners:
        where = {}  # the innermost unit above each name ("" the root)
        for name, above in group:
            unit = next((path for path, cls in reversed(above) if cls in units), "")
            where.setdefault(unit, name)
        if len(where) > 1:
            held = ", ".join(f"{n} ({u or 'the root'})" for u, n in where.items())
            return [
                f"parallel.fsdp_units={given}: {held} are one tied parameter in two "
                "FSDP groups, which fully_shard refuses; leave the class that holds one of "
                "them out of parallel.fsdp_units (the root group keeps them together)"
            ]
    return []


def measured_warnings(target: str, measured: dict[str, Any], block_size: Any) -> list[str]:
    """The forward that failed on one sample of the token windows (fake tensors, then the
    meta device): the plan's memory has no activations, and a step fails the same way
    unless the forward does what fake tensors cannot (before, the plan said the inputs came
    from your dataset, after 100 lines of torch's log)."""
    if not (error := measured.get("saved_error")):
        return []
    cls = target.rsplit(".", 1)[-1]
    return [
        f"model._target_={target}: {cls}'s forward and loss failed on one sample of "
        f"{block_size} tokens on fake and meta tensors ({error}); activations are not "
        "estimated; unless it is what fake tensors cannot do (.item(), a shape read from "
        "values), a training step fails the same way"
    ]


def build_failure(target: str, kwargs: dict[str, Any], exc: BaseException) -> str:
    """One line for a constructor that raised: the arguments given as text where the class's
    default is a number or a flag (``model.block_size=abc``: torch's overload list before),
    else the exception's first line with its type."""
    import inspect

    from dtrain_cli.targets import resolve_target

    cause = exc.__cause__ or exc
    try:
        params = inspect.signature(resolve_target(target, key="model._target_")).parameters
    except Exception:  # no signature (or no import): the error alone
        params = {}
    cls = target.rsplit(".", 1)[-1]
    wrong = [
        f"model.{name}={value!r}: {cls} takes "
        f"{'true or false' if isinstance(params[name].default, bool) else 'a number'} here "
        f"(its default: {params[name].default!r})"
        for name, value in kwargs.items()
        if isinstance(value, str)
        and name in params
        and isinstance(params[name].default, int | float | bool)
    ]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if params and not takes_any and (extra := [k for k in kwargs if k not in params]):
        import difflib  # config.suggest's way, without an import up into config

        close = difflib.get_close_matches(extra[0], list(params), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"model.{extra[0]}: not an argument of {cls}{hint}; its arguments: {', '.join(params)}"
        )
    lines = [x.strip() for x in str(cause).strip().splitlines() if x.strip()] or [""]
    said = f"{type(cause).__name__}: {lines[0].rstrip(':')}"
    return f"model._target_={target}: {'; '.join(wrong) if wrong else said}"
