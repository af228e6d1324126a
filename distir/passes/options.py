"""How a pass declares the values its options accept, and the check of them.

A pass declares each option on its dataclass field (`option(default,
minimum=..., choices=...)`) and calls `check_options` from `__post_init__`;
the pipeline builder (`distir.passes.build_pass`) checks the same
declarations. Pass modules import this module, never the registry in
`distir.passes`, which imports them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xdsl.passes import ModulePass

#: field metadata keys of the option constraints `option` declares
MINIMUM = "distir.minimum"
CHOICES = "distir.choices"


def option(default: Any, *, minimum: int | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A pass option's field with the values it accepts declared beside it:
    integers at least `minimum`, or one of `choices`. `check_options`
    enforces them for pipelines (`build_pass`) and for passes constructed
    from Python (their `__post_init__`)."""
    metadata: dict[str, Any] = {}
    if minimum is not None:
        metadata[MINIMUM] = minimum
    if choices:
        metadata[CHOICES] = tuple(choices)
    return dataclasses.field(default=default, metadata=metadata)


def check_options(instance: ModulePass) -> None:
    """Raises ValueError naming the first option of `instance` whose value
    its field does not accept (`option(minimum=..., choices=...)`)."""
    for f in option_fields(type(instance)):
        value = getattr(instance, f.name)
        if value is None:
            continue
        least = f.metadata.get(MINIMUM)
        if least is not None and (not isinstance(value, int) or value < least):
            raise ValueError(
                f"{instance.name}: option '{kebab(f.name)}' must be an integer >= {least}, "
                f"got {spelled(value)}"
            )
        choices = f.metadata.get(CHOICES)
        if choices and value not in choices:
            raise ValueError(
                f"{instance.name}: option '{kebab(f.name)}' must be one of "
                f"{', '.join(choices)}, got '{spelled(value)}'"
            )


def kebab(name: str) -> str:
    return name.replace("_", "-")


def spelled(value: Any) -> str:
    """A value as a pipeline spec spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(spelled(v) for v in value)
    return str(value)


def option_fields(cls: type[ModulePass]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init and f.name != "name"]
