"""A new op family is a folder, its line in the op table and its helper's
re-export: shown by adding one.

The test copies distir's source, adds a family `ring_shift` (a copy of the
`shift` folder under another name: op `dist.ring_shift`, class
`RingShiftOp`, helper `ring_shift`), writes its import and `Family` line
into `distir/ops/table.py` and its helper's import into
`distir/ir/builder.py`, and touches nothing else. A fresh interpreter on
that copy then parses, verifies, prints, builds, simulates and runs the new
op on two real gloo ranks, checked against `torch.roll`: the dialect, the
builder, the semantics records and the Torch implementations found it from
the table alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import distir

SOURCE = Path(distir.__file__).parent

#: what the new family's user runs in the copy (its own process)
SCRIPT = r'''
import torch
import distir
from distir.ir import builder
from distir.ir.dialect import Dist
from distir.ir.parsing import parse_module

TEXT = """
func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> {
  %y = dist.ring_shift %x offset 1 rotate : tensor<3xf32>
  func.return %y : tensor<3xf32>
}
"""

def on_rank(ctx):
    program = distir.compile(TEXT)
    x = torch.arange(3.0) + 10 * ctx.rank
    return program.run(x)

if __name__ == "__main__":
    assert "dist.ring_shift" in [op.name for op in Dist.operations]
    assert "dist.ring_shift" in str(parse_module(TEXT))
    built = builder.build_program(
        lambda x: builder.ring_shift(x, 1, rotate=True),
        [builder.tensor_type("f32", [3])],
    )
    assert "dist.ring_shift" in str(built), built
    inputs = [[torch.arange(3.0) + 10 * r] for r in range(2)]
    simulated = distir.simulate(distir.compile(built), inputs)
    expected = torch.roll(torch.stack([i[0] for i in inputs]), 1, dims=0)
    for r in range(2):
        assert torch.equal(simulated[r], expected[r]), (r, simulated[r])
    ran = distir.launch(on_rank, 2, pass_context=True, timeout=60)
    for r in range(2):
        assert torch.equal(ran[r], expected[r]), (r, ran[r])
    print("ring_shift ok")
'''


def _rename(text: str) -> str:
    text = text.replace("distir.ops.shift", "distir.ops.ring_shift")
    text = text.replace("dist.shift", "dist.ring_shift")
    text = re.sub(r"\bShift(\w*)", r"RingShift\1", text)
    return re.sub(r"\bdef shift\(", "def ring_shift(", text)


def _add_line_after(path: Path, anchor: str, line: str) -> None:
    text = path.read_text()
    assert text.count(anchor) == 1, (path, anchor)
    path.write_text(text.replace(anchor, anchor + line))


def test_a_new_family_is_a_folder_a_table_line_and_a_re_export(tmp_path: Path) -> None:
    copy = tmp_path / "distir"
    shutil.copytree(SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    family = copy / "ops" / "ring_shift"
    family.mkdir()
    for module in (SOURCE / "ops" / "shift").glob("*.py"):
        (family / module.name).write_text(_rename(module.read_text()))
    # the table: the family's import and its line
    table = copy / "ops" / "table.py"
    _add_line_after(
        table,
        "from distir.ops.shift.ir import ShiftOp\n",
        "from distir.ops.ring_shift.ir import RingShiftOp\n",
    )
    _add_line_after(
        table,
        '    Family("shift", (ShiftOp,), ("shift",)),\n',
        '    Family("ring_shift", (RingShiftOp,), ("ring_shift",)),\n',
    )
    # the builder: its helper's re-export
    _add_line_after(
        copy / "ir" / "builder.py",
        "from distir.ops.shift.build import shift\n",
        "from distir.ops.ring_shift.build import ring_shift\n",
    )
    changed = {
        str(p.relative_to(copy))
        for p in copy.rglob("*.py")
        if not (SOURCE / p.relative_to(copy)).exists()
        or (SOURCE / p.relative_to(copy)).read_text() != p.read_text()
    }
    assert changed == {
        "ops/table.py",
        "ir/builder.py",
        *(f"ops/ring_shift/{m.name}" for m in (SOURCE / "ops" / "shift").glob("*.py")),
    }
    script = tmp_path / "use_ring_shift.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ring_shift ok" in done.stdout
