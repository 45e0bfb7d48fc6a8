"""vLLM's in-process engine on a machine without IP sockets (the TPU machine: errno 97), for the accelerator tier only.

Two things in vLLM's single-host path need an IP socket whatever the settings: the uni-process executor asks
`get_open_port()` for a TCP port (tpu-inference's worker discards it and initialises torch.distributed with a
file:// method), and every process group vLLM makes is gloo's, whose transport is TCP. At world size 1 every
collective is a no-op (vLLM returns before using a group of one), so torch's single-process `fake` backend over a
HashStore stands in for gloo, and the port is not asked. Named in every record as LAUNCH. Not product code: a
private torch module, a process-global patch while it is in, world size 1 only (anything larger is refused).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

LAUNCH = "socketless launch: fake process group, world size 1"
GLOO = ("gloo", "cpu:gloo", None)
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1"}


class NotWorldSizeOneError(RuntimeError):
    """The launch was asked for a process group of more than one process: only world size 1 is a no-op."""


@contextlib.contextmanager
def socketless_launch() -> Iterator[dict[str, int]]:
    """While in: gloo groups of one process are `fake` ones and vLLM's open-port lookup answers 0. Yields counts
    of what was replaced (`init`, `groups`, `ports`) so a record can say the launch was used, not just set."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers the "fake" backend

    counts = {"init": 0, "groups": 0, "ports": 0}
    init, new_group = dist.init_process_group, dist.new_group

    def init_nosock(*args: Any, **kw: Any) -> Any:
        if kw.get("world_size", 1) != 1:
            raise NotWorldSizeOneError(f"{LAUNCH}: init_process_group(world_size={kw.get('world_size')})")
        if kw.get("backend") in GLOO:
            kw.update(backend="fake", init_method=None, store=dist.HashStore(), world_size=1, rank=0)
            counts["init"] += 1
        return init(*args, **kw)

    def new_group_nosock(*args: Any, **kw: Any) -> Any:
        if dist.get_world_size() != 1:
            raise NotWorldSizeOneError(f"{LAUNCH}: new_group in a world of {dist.get_world_size()}")
        if kw.get("backend") in GLOO:
            kw["backend"] = "fake"
            counts["groups"] += 1
        return new_group(*args, **kw)

    def port(*_: Any, **__: Any) -> int:
        counts["ports"] += 1
        return 0  # the worker never uses it (a file:// init method); 0 is never a listening port

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, ENV))
        stack.enter_context(mock.patch.object(dist, "init_process_group", init_nosock))
        stack.enter_context(mock.patch.object(dist, "new_group", new_group_nosock))
        import vllm.v1.executor.uniproc_executor  # noqa: F401  imports whichever module holds get_open_port

        # the lookup is imported by name into several modules (which ones moves between vLLM releases)
        for name, module in list(sys.modules.items()):
            if name.startswith("vllm") and callable(getattr(module, "get_open_port", None)):
                stack.enter_context(mock.patch.object(module, "get_open_port", port))
        yield counts
