"""A ``dtrain run`` script's own ``TCPStore`` at the agent's port (arrival.py): hosting
there fails (the agent's store holds the port) and it is a client of that store instead,
as torchrun's C++ store makes it; any other port or failure is the script's."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from dtrain_cli.runtime.script.arrival import client_at_agent_port

T = timedelta(seconds=5)


@pytest.fixture
def agent():
    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=T)  # the agent's, on a free port


@pytest.mark.parametrize("form", ["positional", "keywords"])
def test_hosting_at_the_agents_port_is_a_client_there(agent, form):
    store_class = client_at_agent_port(dist.TCPStore, agent.port)
    if form == "positional":
        store = store_class("127.0.0.1", agent.port, 2, True, timeout=T)
    else:
        store = store_class(host_name="127.0.0.1", port=agent.port, is_master=True, timeout=T)
    store.set("k", "v")
    assert agent.get("k") == b"v"
    assert isinstance(store, dist.TCPStore) and isinstance(agent, store_class)


def test_another_port_hosts_its_own_store_and_a_taken_one_still_fails(agent):
    store_class = client_at_agent_port(dist.TCPStore, agent.port)
    own = store_class("127.0.0.1", 0, 1, True, timeout=T)  # the script's own, hosted
    assert own.port != agent.port
    with pytest.raises(RuntimeError, match="EADDRINUSE"):
        store_class("127.0.0.1", own.port, 1, True, timeout=T)  # not the agent's port
