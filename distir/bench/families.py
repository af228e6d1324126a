"""The benchmark families: everything `distir-bench` knows about one family,
in one declaration.

A family is one `register(Family(...))` block beside its setup function. The
block names the distir variants (pipeline, implementation choices,
`agreement=False`, donated inputs), the dtypes and reduction ops it can run,
and its bus factor; the setup function builds, on one rank and for one message
size, the program, the inputs, the raw torch.distributed baseline, the
`raw clone+op` row where the family has one, other raw baselines (`raw +
tiny exchange`, the all-to-all's given-splits floor), and the exact
reference when the raw call does not compute the same thing. The runner and the report read
these and nothing else, so adding a family is one block:

    def _my_setup(case: Case) -> Setup: ...

    register(Family("my_family", "what distir runs vs what raw runs", _my_setup,
                    variants=(Variant("distir"),), bus="all_reduce"))

Families travel to the ranks by pickle, so their functions are module-level.
Importing this module does not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from distir.ops.all_reduce.ir import GATHER_FOLD, HALVING_DOUBLING, RECURSIVE_DOUBLING, RING

#: dtypes the native families take with `-d`, and their IR element types.
DTYPES: Mapping[str, str] = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int8": "i8",
}
NATIVE_DTYPES = tuple(DTYPES)
#: reduction ops the native all-reduce takes with `-o`.
OPS = ("sum", "prod", "min", "max")
WAVE_MEMBERS = 32
MODULI_60 = ((1 << 60) - 93, (1 << 60) - 173, (1 << 59) - 55, (1 << 58) - 27)
MODULI_62 = ((1 << 62) - 57, (1 << 62) - 87, (1 << 62) - 117, (1 << 61) - 1)
COMBINE_MASK = (1 << 32) - 1

#: nccl-tests' bus factors: busbw = algbw x factor(P).
BUS_FACTORS: Mapping[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
}


@dataclass(frozen=True)
class Case:
    """One family at one message size, dtype and op, on one rank."""

    nbytes: int
    world_size: int
    rank: int
    device: str = "cpu"
    dtype: str = "float32"
    op: str = ""

    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def elements(self, divisor: int = 1) -> int:
        """How many elements of `dtype` make nbytes / divisor (at least 1)."""
        import torch

        size = torch.empty((), dtype=self.torch_dtype()).element_size()
        return max(1, self.nbytes // size // divisor)

    def data(self, n: int, salt: int = 0) -> Any:
        """`n` reproducible random elements of `dtype`, different on every rank."""
        import torch

        gen = torch.Generator().manual_seed(1234 + 7919 * self.rank + salt)
        dtype = self.torch_dtype()
        if dtype.is_floating_point:
            x = torch.rand(n, generator=gen, dtype=torch.float32).to(dtype)
        else:  # small values: int8 sums of a few ranks stay readable when checking by hand
            x = torch.randint(-40, 40, (n,), generator=gen).to(dtype)
        return x.to(self.device)

    def tensor_type(self, *shape: int) -> str:
        return f"tensor<{'x'.join(str(d) for d in shape)}x{DTYPES[self.dtype]}>"


@dataclass
class Setup:
    """What one rank needs to time one family at one size.

    `raw` is the baseline call and returns its outputs; `reset` runs, untimed,
    before every raw call (in-place collectives overwrite their buffer);
    `clone_op` is the `raw clone+op` row (the least an out-of-place result
    costs over raw torch.distributed); `reference` returns the exact expected
    results when they are not the raw call's outputs (it runs untimed and may
    communicate); `step`, when given, is what a variant's row times, called
    with the variant's compiled program.
    """

    program: str
    inputs: tuple[Any, ...]
    raw: Callable[[], tuple[Any, ...]]
    nbytes: int
    reset: Callable[[], object] | None = None
    clone_op: Callable[[], tuple[Any, ...]] | None = None
    reference: Callable[[], tuple[Any, ...]] | None = None
    baselines: tuple[Baseline, ...] = ()
    #: a family that times user code around its program (a training step):
    #: each variant's row calls `step(compiled program)` instead of its run
    step: Callable[[Any], tuple[Any, ...]] | None = None


@dataclass(frozen=True)
class Baseline:
    """Another raw torch.distributed row a family's variants are judged
    against (the table gives its ratio to `raw` like any row): `raw + tiny
    exchange` (what a verified run can at best cost), or the given-splits
    floor of the all-to-all. `reset` runs untimed before every call."""

    name: str
    run: Callable[[], tuple[Any, ...]]
    reset: Callable[[], object] | None = None


@dataclass(frozen=True)
class Variant:
    """One way of running a family's program.

    `pipeline` is a distir-opt pipeline in which `{P}` stands for the group
    size; `donate` is passed to `Program.run` (True, or input indices), and
    donated inputs are reset, untimed, before every call.
    """

    name: str
    pipeline: str = ""
    implementations: Mapping[str, str] | None = None
    agreement: bool = True
    donate: bool | tuple[int, ...] = False

    def pipeline_for(self, world_size: int) -> str:
        return self.pipeline.replace("{P}", str(world_size))

    def donated(self, count: int) -> tuple[int, ...]:
        if self.donate is True:
            return tuple(range(count))
        return tuple(self.donate) if self.donate else ()


@dataclass(frozen=True)
class Family:
    """A benchmark family: its setup, its variants and how to count its bytes.

    `dtypes` lists what `-d` may choose (the first is the default; a single
    entry is the family's fixed dtype); `ops` likewise for `-o`.
    """

    name: str
    doc: str
    setup: Callable[[Case], Setup]
    variants: tuple[Variant, ...]
    bus: str
    dtypes: tuple[str, ...] = ("int64",)
    ops: tuple[str, ...] = ()

    def bus_factor(self, world_size: int) -> float:
        return BUS_FACTORS[self.bus](world_size)

    def cases(self, dtypes: Sequence[str], ops: Sequence[str]) -> list[tuple[str, str]]:
        """The (dtype, op) pairs to run for the requested `-d` and `-o` values:
        the requested ones where the family has a choice, else its own."""
        mine_d = [d for d in dtypes if d in self.dtypes] if len(self.dtypes) > 1 else []
        mine_o = [o for o in ops if o in self.ops] if len(self.ops) > 1 else []
        return [(d, o) for d in mine_d or self.dtypes[:1] for o in mine_o or self.ops[:1] or [""]]


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.name in FAMILIES:
        raise ValueError(f"family {family.name!r} is registered twice")
    FAMILIES[family.name] = family
    return family


def program(args: Sequence[tuple[str, str]], body: str, results: Sequence[tuple[str, str]]) -> str:
    """`func.func @main` over named, typed arguments and results."""
    params = ", ".join(f"%{name}: {t}" for name, t in args)
    types = ", ".join(t for _, t in results)
    values = ", ".join(f"%{name}" for name, _ in results)
    return (
        f"func.func @main({params}) -> ({types}) {{\n  {body}\n"
        f"  func.return {values} : {types}\n}}\n"
    )


def _reduce_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
            "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op]  # fmt: skip


def _all_gather_single() -> Callable[..., Any]:
    import torch.distributed as dist

    # torch 2.13 renamed all_gather_into_tensor (and deprecated the old name).
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _tiny_exchange(case: Case) -> Callable[[], None]:
    """One all_to_all_single of 4 int64 words per peer: the size and shape of
    distir's run agreement (`RunAgreement`), the least a verified run adds."""
    import torch
    import torch.distributed as dist

    words = torch.zeros(4 * case.world_size, dtype=torch.int64, device=case.device)
    received = torch.empty_like(words)
    return lambda: dist.all_to_all_single(received, words)


SELECT = "select-all-reduce-algorithm"
DISTIR = Variant("distir")
NO_AGREEMENT = Variant("distir, no agreement", agreement=False)
DONATED = Variant("distir, donated", donate=True)
TRUSTED_DONATED = Variant("distir, no agreement, donated", agreement=False, donate=True)
TINY = "raw + tiny exchange"
# Multi-input programs donate their payload only (counts and moduli are not reusable storage).
DONATED_PAYLOAD = Variant("distir, donated", donate=(0,))


###############################################################################
# all_reduce: `dist.all_reduce <op>` vs dist.all_reduce in place
###############################################################################


def all_reduce_setup(case: Case) -> Setup:
    import torch.distributed as dist

    n = case.elements()
    t = case.tensor_type(n)
    x = case.data(n)
    buf = x.clone()
    op = _reduce_op(case.op)

    def raw():
        dist.all_reduce(buf, op=op)
        return (buf,)

    def clone_op():
        y = x.clone()
        dist.all_reduce(y, op=op)
        return (y,)

    tiny = _tiny_exchange(case)

    def raw_tiny():
        tiny()
        return raw()

    text = program([("x", t)], f"%y = dist.all_reduce {case.op} %x : {t}", [("y", t)])
    reset = lambda: buf.copy_(x)  # noqa: E731
    return Setup(text, (x,), raw, x.nbytes, reset, clone_op,
                 baselines=(Baseline(TINY, raw_tiny, reset),))  # fmt: skip


register(Family(
    "all_reduce", "`dist.all_reduce <op>` vs dist.all_reduce in place", all_reduce_setup,
    variants=(DISTIR, NO_AGREEMENT, DONATED, TRUSTED_DONATED), bus="all_reduce",
    dtypes=NATIVE_DTYPES, ops=OPS,
))  # fmt: skip


###############################################################################
# broadcast: `dist.broadcast root 0` vs dist.broadcast in place
###############################################################################


def broadcast_setup(case: Case) -> Setup:
    import torch.distributed as dist

    n = case.elements()
    t = case.tensor_type(n)
    x = case.data(n)
    buf = x.clone()

    def raw():
        dist.broadcast(buf, src=0)
        return (buf,)

    def clone_op():
        y = x.clone()
        dist.broadcast(y, src=0)
        return (y,)

    tiny = _tiny_exchange(case)

    def raw_tiny():
        tiny()
        return raw()

    text = program([("x", t)], f"%y = dist.broadcast %x root 0 : {t}", [("y", t)])
    reset = lambda: buf.copy_(x)  # noqa: E731
    return Setup(text, (x,), raw, x.nbytes, reset, clone_op,
                 baselines=(Baseline(TINY, raw_tiny, reset),))  # fmt: skip


register(Family(
    "broadcast", "`dist.broadcast root 0` vs dist.broadcast", broadcast_setup,
    variants=(DISTIR, DONATED, TRUSTED_DONATED), bus="broadcast", dtypes=NATIVE_DTYPES,
))  # fmt: skip


###############################################################################
# all_gather: `dist.all_gather` vs all_gather_into_tensor (S = the output)
###############################################################################


def all_gather_setup(case: Case) -> Setup:
    import torch

    p = case.world_size
    m = case.elements(p)
    x = case.data(m)
    out = torch.empty(m * p, dtype=x.dtype, device=x.device)
    gather = _all_gather_single()

    def raw():
        gather(out, x)
        return (out,)

    def clone_op():  # the collective is out of place: the "clone" is a fresh output
        fresh = torch.empty_like(out)
        gather(fresh, x)
        return (fresh,)

    tx, ty = case.tensor_type(m), case.tensor_type(m * p)
    text = program([("x", tx)], f"%y = dist.all_gather %x axis 0 : {tx} -> {ty}", [("y", ty)])
    return Setup(text, (x,), raw, out.nbytes, None, clone_op)


register(Family(
    "all_gather", "`dist.all_gather` vs all_gather_into_tensor", all_gather_setup,
    variants=(DISTIR, DONATED), bus="all_gather", dtypes=NATIVE_DTYPES,
))  # fmt: skip


###############################################################################
# reduce_scatter: `dist.reduce_scatter sum` vs reduce_scatter_tensor (S = the input)
###############################################################################


def reduce_scatter_setup(case: Case) -> Setup:
    import torch
    import torch.distributed as dist

    p = case.world_size
    m = case.elements(p)
    x = case.data(m * p)
    out = torch.empty(m, dtype=x.dtype, device=x.device)
    # torch 2.13 renamed reduce_scatter_tensor (and deprecated the old name).
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def raw():
        scatter(out, x)
        return (out,)

    def clone_op():  # the collective is out of place: the "clone" is a fresh output
        fresh = torch.empty_like(out)
        scatter(fresh, x)
        return (fresh,)

    tx, ty = case.tensor_type(m * p), case.tensor_type(m)
    text = program(
        [("x", tx)], f"%y = dist.reduce_scatter sum %x axis 0 : {tx} -> {ty}", [("y", ty)]
    )
    return Setup(text, (x,), raw, x.nbytes, None, clone_op)


register(Family(
    "reduce_scatter", "`dist.reduce_scatter sum` vs reduce_scatter_tensor", reduce_scatter_setup,
    variants=(
        DISTIR,
        Variant("ring", implementations={"dist.reduce_scatter": "ring"}),
        Variant("direct", implementations={"dist.reduce_scatter": "direct"}),
    ),
    bus="reduce_scatter", dtypes=NATIVE_DTYPES,
))  # fmt: skip


###############################################################################
# fsdp_step: one FSDP/ZeRO-3 training step (examples/fsdp_mlp.py's) vs the
# same step written with raw torch.distributed (S = the parameters)
###############################################################################

FSDP_WIDTH, FSDP_BATCH = 256, 32
FSDP_GATHER = """
func.func @main(%shard: tensor<?xf32>) -> tensor<?xf32> {
  %full = dist.all_gather %shard axis 0 : tensor<?xf32> -> tensor<?xf32>
  func.return %full : tensor<?xf32>
}"""


def fsdp_step_setup(case: Case) -> Setup:
    """`y = relu(x @ W1) @ W2`, W1 [d, h] and W2 [h, d] of S bytes together,
    each flattened and sharded over the P ranks. A step gathers each
    layer's weight, runs forward and backward of this rank's batch, and
    leaves every shard's gradient summed over the ranks. distir: one run of
    the all-gather program per layer, its backward (a reduce-scatter) run
    by autograd. Raw: all_gather_into_tensor per layer, backward on the
    full weights, reduce_scatter_tensor of each weight's gradient. Both
    return the shard gradients."""
    import torch
    import torch.distributed as dist

    p, rank = case.world_size, case.rank
    d = FSDP_WIDTH
    h = max(p, case.nbytes // 4 // (2 * d) // p * p)
    shapes = ((d, h), (h, d))
    gen = torch.Generator().manual_seed(99)
    weights = [torch.randn(*shape, generator=gen) * 0.05 for shape in shapes]
    x = case.data(FSDP_BATCH * d).view(FSDP_BATCH, d)
    target = case.data(FSDP_BATCH * d, salt=1).view(FSDP_BATCH, d)
    raw_shards = [w.flatten().chunk(p)[rank].clone() for w in weights]
    shards = [s.clone().requires_grad_(True) for s in raw_shards]
    gather = _all_gather_single()
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def loss_of(w1, w2):
        return ((torch.relu(x @ w1) @ w2 - target) ** 2).mean() / p

    def raw():
        full = []
        for s, shape in zip(raw_shards, shapes):
            w = torch.empty(s.numel() * p)
            gather(w, s)
            full.append(w.view(shape).requires_grad_(True))
        loss_of(*full).backward()
        grads = []
        for s, w in zip(raw_shards, full):
            g = torch.empty_like(s)
            scatter(g, w.grad.flatten())
            grads.append(g)
        return tuple(grads)

    def step(program):
        w1, w2 = (program.run(s).view(shape) for s, shape in zip(shards, shapes))
        loss_of(w1, w2).backward()
        grads = tuple(s.grad for s in shards)
        for s in shards:
            s.grad = None
        return grads

    return Setup(FSDP_GATHER, (), raw, sum(w.nbytes for w in weights), step=step)


register(Family(
    "fsdp_step", "FSDP MLP step (all-gather, backward reduce-scatter) vs raw torch.distributed",
    fsdp_step_setup, variants=(DISTIR,), bus="all_gather", dtypes=("float32",),
))  # fmt: skip


###############################################################################
# all_to_all: `dist.variable_all_to_all`, uneven counts, vs all_to_all_single
###############################################################################


def all_to_all_setup(case: Case) -> Setup:
    import torch
    import torch.distributed as dist

    p, rank = case.world_size, case.rank
    # Rank r sends w(r, j) units to j; every row and column of w sums to
    # P(P+1)/2, so each rank sends and receives about S.
    unit = case.elements(p * (p + 1) // 2)
    send = [((rank + j) % p + 1) * unit for j in range(p)]
    recv = [((j + rank) % p + 1) * unit for j in range(p)]
    n = sum(send)
    x = case.data(n)
    out = torch.empty(sum(recv), dtype=x.dtype, device=x.device)
    counts = torch.tensor(send, dtype=torch.int64, device=x.device)
    received = torch.tensor(recv, dtype=torch.int64, device=x.device)
    exchanged = torch.empty_like(counts)

    def raw():
        # What a mixture-of-experts dispatch must do: exchange the counts
        # (one all_to_all_single of one word per peer), then the rows. The
        # output buffer is reused when the counts allow (a generous raw).
        dist.all_to_all_single(exchanged, counts)
        splits = exchanged.tolist()
        rows = out if sum(splits) == out.numel() else torch.empty(sum(splits), dtype=x.dtype)
        dist.all_to_all_single(rows, x, splits, send)
        return (rows, exchanged)

    def given_splits():  # the floor: the raw call is handed its receive splits
        dist.all_to_all_single(out, x, recv, send)
        return (out, received)

    def clone_op():  # out of place by nature: the "clone" is a fresh output
        fresh = torch.empty_like(out)
        dist.all_to_all_single(fresh, x, recv, send)
        return (fresh, received)

    tx, tc, ty = case.tensor_type(n), f"tensor<{p}xi64>", f"tensor<?x{DTYPES[case.dtype]}>"
    body = f"%y, %rc = dist.variable_all_to_all %x, %c axis 0 : {tx}, {tc} -> {ty}"
    text = program([("x", tx), ("c", tc)], body, [("y", ty), ("rc", tc)])
    return Setup(text, (x, counts), raw, x.nbytes, None, clone_op,
                 baselines=(Baseline(GIVEN_SPLITS, given_splits),))  # fmt: skip


GIVEN_SPLITS = "raw, splits given"
register(Family(
    "all_to_all", "`dist.variable_all_to_all` (uneven counts) vs all_to_all_single of the "
    "counts, then of the rows", all_to_all_setup,
    variants=(DISTIR, DONATED_PAYLOAD, Variant("distir, no agreement", agreement=False)),
    bus="all_to_all", dtypes=NATIVE_DTYPES,
))  # fmt: skip


###############################################################################
# combine: a generic commutative combine, (a + b) mod 2^32 on i64, per
# algorithm, vs a native i64 sum of the same bytes
###############################################################################


def combine_setup(case: Case) -> Setup:
    import torch
    import torch.distributed as dist

    n = case.elements()
    t = case.tensor_type(n)
    gen = torch.Generator().manual_seed(4321 + case.rank)
    x = torch.randint(0, 1 << 32, (n,), generator=gen).to(case.device)
    buf = x.clone()

    def raw():
        dist.all_reduce(buf)
        return (buf,)

    def reference():  # the wrapped i64 sum is exact mod 2^32
        buf.copy_(x)
        dist.all_reduce(buf)
        return (buf & COMBINE_MASK,)

    body = (f"%y = dist.all_reduce %x commutative : {t} combine(%a, %b) {{\n"
            f"    %s = arith.addi %a, %b : {t}\n"
            f"    %m = arith.constant dense<{COMBINE_MASK}> : {t}\n"
            f"    %r = arith.andi %s, %m : {t}\n"
            f"    dist.yield %r : {t}\n  }}")  # fmt: skip
    text = program([("x", t)], body, [("y", t)])
    return Setup(text, (x,), raw, x.nbytes, lambda: buf.copy_(x), reference=reference)


register(Family(
    "combine", "generic commutative (a + b) mod 2^32 on i64 per algorithm vs native i64 sum",
    combine_setup, bus="all_reduce",
    variants=(
        Variant(GATHER_FOLD, f"{SELECT}{{commutative={GATHER_FOLD}}}"),
        Variant(RING, SELECT),
        Variant(f"{RING}, donated", SELECT, donate=True),
        Variant(HALVING_DOUBLING, f"{SELECT}{{commutative={HALVING_DOUBLING}}}"),
        Variant(RECURSIVE_DOUBLING, f"{SELECT}{{commutative={RECURSIVE_DOUBLING}}}"),
    ),
))  # fmt: skip


###############################################################################
# ciphertext, ciphertext62: `dist.all_reduce_add_ciphertext`, 4 RNS limbs,
# per lowering, vs a native i64 sum of the same bytes; the reference is the
# exact modular sum
###############################################################################


def _ciphertext_setup(case: Case, moduli: tuple[int, ...], bits: int) -> Setup:
    import torch
    import torch.distributed as dist

    limbs = len(moduli)
    n = case.elements(limbs)
    t = case.tensor_type(limbs, n)
    q = torch.tensor(moduli, dtype=torch.int64)
    gen = torch.Generator().manual_seed(4321 + case.rank)
    ct = (torch.randint(0, 1 << 62, (limbs, n), generator=gen) % q.view(-1, 1)).to(case.device)
    q = q.to(case.device)
    buf = ct.clone()

    def raw():
        dist.all_reduce(buf)
        return (buf,)

    def reference():  # gather every rank's limbs, add mod q (a + b < 2^63 for q < 2^62)
        stacked = torch.empty((case.world_size, limbs, n), dtype=torch.int64, device=ct.device)
        _all_gather_single()(stacked.view(-1), ct.reshape(-1))
        acc = stacked[0].clone()
        for other in stacked[1:]:
            acc += other
            acc -= q.view(-1, 1) * (acc >= q.view(-1, 1))
        return (acc,)

    body = (f"%y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits {bits} : "
            f"{t}, tensor<{limbs}xi64>")  # fmt: skip
    text = program([("ct", t), ("q", f"tensor<{limbs}xi64>")], body, [("y", t)])
    return Setup(text, (ct, q), raw, ct.nbytes, lambda: buf.copy_(ct), reference=reference)


def ciphertext_setup(case: Case) -> Setup:
    return _ciphertext_setup(case, MODULI_60, 60)


def ciphertext62_setup(case: Case) -> Setup:
    return _ciphertext_setup(case, MODULI_62, 62)


EXACT = Variant("exact-modular-sum", "", {"dist.all_reduce_add_ciphertext": "exact-modular-sum"})
register(Family(
    "ciphertext", "`dist.all_reduce_add_ciphertext`, moduli < 2^60, per lowering vs native i64 sum",
    ciphertext_setup, bus="all_reduce",
    variants=(
        Variant("auto"),
        Variant("auto, no agreement", agreement=False),
        Variant("auto, donated", donate=(0,)),
        EXACT,
        Variant("defer-pass", "defer-modular-reduction{max-group-size={P}}"),
        Variant("lowered+gather-fold", "lower-ciphertext-add"),
        Variant("lowered+ring", f"lower-ciphertext-add,{SELECT}"),
    ),
))  # fmt: skip
register(Family(
    "ciphertext62", "the same with moduli near 2^62 (no headroom to defer)", ciphertext62_setup,
    variants=(Variant("auto"), EXACT), bus="all_reduce",
))  # fmt: skip


###############################################################################
# wave: 32 native all-reduces of S/32 each, separate or bucketed, vs 32
# dist.all_reduce calls
###############################################################################


def wave_setup(case: Case) -> Setup:
    import torch.distributed as dist

    m = case.elements(WAVE_MEMBERS)
    t = case.tensor_type(m)
    xs = [case.data(m, salt=i) for i in range(WAVE_MEMBERS)]
    bufs = tuple(x.clone() for x in xs)

    def raw():
        for b in bufs:
            dist.all_reduce(b)
        return bufs

    def reset():
        for b, x in zip(bufs, xs):
            b.copy_(x)

    body = "\n  ".join(f"%y{i} = dist.all_reduce sum %x{i} : {t}" for i in range(WAVE_MEMBERS))
    text = program([(f"x{i}", t) for i in range(WAVE_MEMBERS)], body,
                   [(f"y{i}", t) for i in range(WAVE_MEMBERS)])  # fmt: skip
    return Setup(text, tuple(xs), raw, sum(x.nbytes for x in xs), reset)


register(Family(
    "wave", f"{WAVE_MEMBERS} all-reduces of S/{WAVE_MEMBERS}, separate or bucketed, vs "
    f"{WAVE_MEMBERS} dist.all_reduce calls", wave_setup, bus="all_reduce", dtypes=NATIVE_DTYPES,
    ops=("sum",), variants=(Variant("separate"), Variant("bucketed", "bucket-all-reduces")),
))  # fmt: skip
