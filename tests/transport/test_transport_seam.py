"""The transport seam is typed: every op implementation takes its group as a
`Transport` (`distir.transport.protocol`), and the c10d process group is one."""

from __future__ import annotations

import inspect

import pytest
import torch

from distir.ops.all_reduce.torch import algorithm_contributions
from distir.ops.reduce_scatter.torch import schedule_contributions
from distir.transport.groups import COLLECTIVE_DTYPES, ProcessGroupResource
from distir.transport.implementations import distributed_operation_contributions
from distir.transport.protocol import Abort, Transport
from distir.transport.registry import Implementation

#: the methods through which an implementation is handed its group
SEAM = ("execute", "start", "bind", "executing", "direct")


def _implementations() -> list[type[Implementation]]:
    found = [*distributed_operation_contributions(), *algorithm_contributions(),
             *schedule_contributions()]  # fmt: skip
    return sorted({type(i) for i in found}, key=lambda c: c.__qualname__)


@pytest.mark.parametrize("cls", _implementations(), ids=lambda c: c.__qualname__)
def test_every_implementation_takes_its_group_as_a_transport(cls: type) -> None:
    for name in SEAM:
        parameters = inspect.signature(getattr(cls, name)).parameters
        assert parameters["resources"].annotation == "Transport", f"{cls.__qualname__}.{name}"


def test_the_process_group_is_a_transport_and_declares_gloos_capabilities(one_rank_world) -> None:
    resource = ProcessGroupResource()
    assert isinstance(resource, Transport)
    caps = resource.capabilities
    assert caps.devices == frozenset({"cpu"}) and resource.device == torch.device("cpu")
    assert caps.moves == caps.reduces == COLLECTIVE_DTYPES
    assert caps.store and caps.abort is Abort.DEADLINE
