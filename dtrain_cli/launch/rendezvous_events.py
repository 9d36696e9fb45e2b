"""The name torch's dynamic rendezvous gives its events, without ``inspect.stack()``.

``torch.distributed.elastic.rendezvous.dynamic_rendezvous`` names every rendezvous event
``Class.<caller>`` through ``get_method_name()``, which calls ``inspect.stack()`` twice:
that reads the source lines of every frame on the stack and searches ``sys.modules`` for
each frame's module. The name is computed before the event is dropped (no handler records
rendezvous events unless one is configured), and in an agent that has imported torch
(some 2,500 modules) it costs about 0.1 s of CPU a call, 9 calls a rendezvous: most of a
second of every launch's start-up, on every node, and again at each elastic restart
(torch 2.13). The caller's name is one frame lookup away; events keep the same name.
"""

from __future__ import annotations

import sys

_MARK = "_dtrain_frame_lookup"


def _caller_name(depth: int = 2) -> str:
    """``inspect.stack()[depth].function`` of torch's ``get_method_name``, from the frame."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack shallower than depth
        return "no_method_name"


setattr(_caller_name, _MARK, True)


def name_events_cheaply() -> None:
    """Install :func:`_caller_name` as the rendezvous' ``get_method_name`` (idempotent);
    a torch without that function is left as it is."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    current = getattr(dynamic_rendezvous, "get_method_name", None)
    if current is not None and not getattr(current, _MARK, False):
        dynamic_rendezvous.get_method_name = _caller_name
