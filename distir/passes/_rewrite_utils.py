"""Helpers shared by distir's rewrite patterns."""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.dialects.builtin import LocationAttr, ModuleOp
from xdsl.ir import Operation
from xdsl.pattern_rewriter import GreedyRewritePatternApplier, PatternRewriteWalker, RewritePattern


def with_location(ops: Iterable[Operation], location: LocationAttr) -> None:
    """Stamp the source op's location on ops a rewrite creates, so that errors
    raised later (a verifier, a backend) still point at the source line."""
    for op in ops:
        for nested in op.walk():
            nested.location = location


def rewrite_once(module: ModuleOp, *patterns: RewritePattern) -> None:
    """Applies `patterns` to every op of `module` in one walk: the ops a
    pattern creates are not rewritten again, and nothing is deleted for
    being unused (a lowering must not drop a collective or a `dist.rank`)."""
    PatternRewriteWalker(
        GreedyRewritePatternApplier(list(patterns), dce_enabled=False),
        apply_recursively=False,
    ).rewrite_module(module)
