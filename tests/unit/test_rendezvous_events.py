"""torch's rendezvous event names, from the frame instead of ``inspect.stack()``
(dtrain_cli/launch/rendezvous_events.py): the same names. (What it saves is measured in
the launch's start-up phases, not timed here.)"""

from __future__ import annotations

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from dtrain_cli.launch import rendezvous_events


class Handler:
    """The shape of torch's callers: ``_record`` names the method that called it."""

    def _record(self) -> str:
        return f"{type(self).__name__}.{dynamic_rendezvous.get_method_name()}"

    def next_rendezvous(self) -> str:
        return self._record()


def _deep(n: int, handler: Handler) -> str:
    return _deep(n - 1, handler) if n else handler.next_rendezvous()


def test_events_keep_their_names(monkeypatch):
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    torch_names = [_deep(depth, Handler()) for depth in (0, 20)]
    rendezvous_events.name_events_cheaply()
    rendezvous_events.name_events_cheaply()  # once is enough: the second leaves it
    assert dynamic_rendezvous.get_method_name is rendezvous_events._caller_name
    assert [_deep(depth, Handler()) for depth in (0, 20)] == torch_names
    assert torch_names == ["Handler.next_rendezvous"] * 2
    assert rendezvous_events._caller_name(10_000) == "no_method_name"
