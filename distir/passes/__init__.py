"""distir's passes, one module per pass, and the registry of pass names.

`get_all_passes()` maps every pass name usable in a pipeline (`distir-opt -p`,
`distir.compile(pipeline=...)`) to a factory returning the pass class: xDSL's
own passes (canonicalize, cse, dce, ...) plus distir's. Factories import
lazily so that listing passes stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.arg_spec import ArgSpecParseError


def _lower_ciphertext_add() -> type[ModulePass]:
    from distir.passes.lower_ciphertext_add import LowerCiphertextAddPass

    return LowerCiphertextAddPass


def _defer_modular_reduction() -> type[ModulePass]:
    from distir.passes.defer_modular_reduction import DeferModularReductionPass

    return DeferModularReductionPass


def _recognize_native_reductions() -> type[ModulePass]:
    from distir.passes.recognize_native_reductions import RecognizeNativeReductionsPass

    return RecognizeNativeReductionsPass


def _select_all_reduce_algorithm() -> type[ModulePass]:
    from distir.passes.select_all_reduce_algorithm import SelectAllReduceAlgorithmPass

    return SelectAllReduceAlgorithmPass


def _bucket_all_reduces() -> type[ModulePass]:
    from distir.passes.bucket_all_reduces import BucketAllReducesPass

    return BucketAllReducesPass


def _verify_spmd() -> type[ModulePass]:
    from distir.passes.verify_spmd import VerifySPMDPass

    return VerifySPMDPass


def _print_transfer_maps() -> type[ModulePass]:
    from distir.passes.print_transfer_maps import PrintTransferMapsPass

    return PrintTransferMapsPass


DISTIR_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "lower-ciphertext-add": _lower_ciphertext_add,
    "defer-modular-reduction": _defer_modular_reduction,
    "recognize-native-reductions": _recognize_native_reductions,
    "select-all-reduce-algorithm": _select_all_reduce_algorithm,
    "bucket-all-reduces": _bucket_all_reduces,
    "verify-spmd": _verify_spmd,
    "print-transfer-maps": _print_transfer_maps,
}


def get_all_passes() -> dict[str, Callable[[], type[ModulePass]]]:
    """xDSL's passes and distir's, by pipeline name."""
    from xdsl.transforms import get_all_passes as xdsl_passes

    passes = dict(xdsl_passes())
    passes.update(DISTIR_PASSES)
    return passes


def parse_pipeline(spec: str) -> PassPipeline:
    """A pipeline from `distir-opt -p` syntax; the module is verified after
    every pass."""

    def verify_after(_prev: ModulePass, module: ModuleOp, _next: ModulePass) -> None:
        module.verify()

    try:
        return PassPipeline.parse_spec(get_all_passes(), spec, callback=verify_after)
    except ArgSpecParseError as e:  # a BaseException in xDSL 0.74: make it a ValueError
        raise ValueError(f"malformed pipeline {spec!r}: {e}") from None


def apply_pipeline(ctx: Context, module: ModuleOp, spec: str) -> None:
    """Applies `spec` and verifies the result (the pipeline callback only
    runs between passes)."""
    if spec.strip():
        parse_pipeline(spec).apply(ctx, module)
        module.verify()
