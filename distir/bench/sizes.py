"""Message sizes: parsing (`4K`, `16M`), printing and the nccl-tests sweep."""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

_UNITS = {"K": KIB, "M": MIB, "G": GIB}


def parse_size(text: str) -> int:
    """Bytes from `4K`, `64KiB`, `16M`, `1G` or a plain number.

    >>> parse_size("64KiB"), parse_size("100")
    (65536, 100)
    """
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if cleaned and cleaned[-1] in _UNITS:
            value = int(float(cleaned[:-1]) * _UNITS[cleaned[-1]])
        else:
            value = int(cleaned)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 4K, 64KiB, 16M, 1G)") from None
    if value < 1:
        raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    return value


def format_size(size: int) -> str:
    """The shortest exact binary-unit spelling: 4096 -> `4K`, 100 -> `100`."""
    for unit, scale in (("G", GIB), ("M", MIB), ("K", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def size_sweep(minbytes: int, maxbytes: int, stepfactor: int = 2) -> list[int]:
    """nccl-tests' `-b/-e/-f` sweep: minbytes, minbytes x f, ... while <= maxbytes.

    >>> [format_size(s) for s in size_sweep(4096, 1 << 20, 16)]
    ['4K', '64K', '1M']
    """
    if minbytes > maxbytes:
        raise ValueError(
            f"minbytes {format_size(minbytes)} exceeds maxbytes {format_size(maxbytes)}"
        )
    if stepfactor < 2 and minbytes < maxbytes:
        raise ValueError(f"stepfactor must be at least 2 to sweep, got {stepfactor}")
    sizes = [minbytes]
    while minbytes < maxbytes and sizes[-1] * stepfactor <= maxbytes:
        sizes.append(sizes[-1] * stepfactor)
    return sizes
