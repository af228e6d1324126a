"""The c10d transport is typed all through: no `Any` in the signatures of
`ProcessGroupResource`'s methods or the direct collective's fields, and what
its methods are handed as `invocation` is an `Occasion` (an op's
`Invocation`, or a `Step` for the exchanges that are not an op's)."""

from __future__ import annotations

import dataclasses
import inspect

import distir
from distir.transport.direct import DirectCollective
from distir.transport.groups import ProcessGroupResource, Step
from distir.transport.protocol import Occasion
from distir.transport.registry import Implementation, ImplementationRegistry


def _annotations(cls: type) -> dict[str, str]:
    found = {}
    for name, member in vars(cls).items():
        if inspect.isfunction(member):
            for parameter, annotation in member.__annotations__.items():
                found[f"{cls.__name__}.{name}({parameter})"] = str(annotation)
    return found


def test_no_any_on_the_c10d_transport() -> None:
    found = _annotations(ProcessGroupResource) | _annotations(Implementation)
    found |= _annotations(ImplementationRegistry)
    found |= {
        f"DirectCollective.{f.name}": str(f.type) for f in dataclasses.fields(DirectCollective)
    }
    untyped = sorted(where for where, annotation in found.items() if "Any" in annotation)
    assert untyped == []
    # every method that is handed an invocation types it
    invocations = {w: a for w, a in found.items() if w.endswith("(invocation)")}
    assert len(invocations) >= 15, invocations
    assert set(invocations.values()) <= {"Occasion", "Invocation"}, invocations


def test_steps_and_invocations_are_occasions() -> None:
    program = distir.compile(
        "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {\n"
        "  %y = dist.all_reduce sum %x : tensor<2xf32>\n  func.return %y : tensor<2xf32>\n}"
    )
    (invocation,) = program.plan.invocations.values()
    assert isinstance(invocation, Occasion)
    assert isinstance(Step("the program agreement"), Occasion)
    assert not isinstance(object(), Occasion)


def test_no_module_of_the_transport_says_any() -> None:
    import re
    from pathlib import Path

    import distir.transport

    folder = Path(distir.transport.__file__).parent
    saying = sorted(
        f"{path.name}:{n}"
        for path in folder.glob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bAny\b", line)
    )
    assert saying == []
