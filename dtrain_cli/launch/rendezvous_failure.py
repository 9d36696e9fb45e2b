"""Why the nodes of a multi-node run did not meet (or no longer meet), in one line.

    dtrain launch recipe=gpt_tiny dp=2 --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29500

torch's rendezvous errors name a timeout or a connection; the line says which node should
have done what: the others did not come within ``launcher.rdzv_timeout_s``, this node could
not host (node 0) or reach (the others) the store, or node 0, the store's host, ended
while the run trained.
"""

from __future__ import annotations

from typing import Any

from dtrain_cli.config.schema import DtrainConfig


def rendezvous_failure(
    exc: BaseException, config: Any, cfg: DtrainConfig, trained: bool = False
) -> str:
    """Why the nodes never met: the others did not come within the rendezvous timeout, or
    this node could not host (node 0) or reach (the others) the store at the endpoint; or,
    the run ``trained`` already, node 0 (the store's host) went away."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    where = f"{cfg.launcher.rdzv_endpoint} (id {config.run_id})"
    if (
        trained
        and isinstance(exc, RendezvousConnectionError)
        and config.rdzv_configs.get("is_host") is False  # a node that does not host it
    ):
        return (
            f"lost the rendezvous store at {where}: node 0, which hosts it, ended; the run "
            "cannot go on without it; run the launch command again on every node to continue "
            "from the newest checkpoint"
        )
    nodes = f"{config.min_nodes}:{config.max_nodes}"
    nodes = str(config.max_nodes) if config.min_nodes == config.max_nodes else nodes
    if isinstance(exc, RendezvousTimeoutError):
        return (
            f"the rendezvous at {where} did not gather --nnodes {nodes} within "
            f"launcher.rdzv_timeout_s={cfg.launcher.rdzv_timeout_s}: start every node with the "
            "same --rdzv-endpoint, --rdzv-id and --nnodes (one of them --node-rank 0)"
        )
    if not isinstance(exc, RendezvousConnectionError):  # its state broken: torch's words
        return f"the rendezvous at {where} failed: {type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    said = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    said = f" ({said})" if said else ""
    if config.rdzv_configs.get("is_host", True):
        return (
            f"this node could not host the rendezvous store at {where}{said}: is another "
            "node started as --node-rank 0, or another run using the port?"
        )
    return (
        f"this node could not reach the rendezvous store at {where}{said}: start node 0 "
        "(--node-rank 0) first, with the same --rdzv-endpoint, and check that this node "
        "reaches its host and port"
    )
