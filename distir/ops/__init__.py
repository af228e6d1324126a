"""The dist ops, one folder per op family.

A family folder holds everything specific to its ops:

- `ir.py`: the op classes (torch-free): operands, properties, declared
  syntax, verifier, facts (traits), transpose rule;
- `build.py`: the builder helpers (re-exported by `distir.ir.builder`);
- `semantics.py`: the semantics records (decode, precondition, reference
  meaning), `SEMANTICS`;
- `torch.py` (or the package `torch/`): the Torch implementations,
  `implementations(options)`.

`table.py` lists the families: the dialect's op list, the semantics list,
the default implementations and the builder helpers are derived from it, so a new family is one
folder plus one line there. Modules named `semantics` sit on the execution
core's layer and modules named `torch` on the backends' layer; every other
module of a family is IR and imports no torch.
"""

# The dialect (`distir.ir`) imports every family through the op table, and a
# family's IR imports modules of `distir.ir`: importing the dialect first
# makes a family module safe to import on its own (an example importing
# `distir.ops.all_reduce.ir` before anything else).
import distir.ir  # noqa: E402, F401
