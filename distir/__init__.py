"""distir: a compiler and runtime for distributed tensor communication.

    import distir
    program = distir.compile("examples/all_reduce.mlir", pipeline="canonicalize")
    results = distir.simulate(program, [[x0], [x1]])      # reference, one process
    distir.launch(worker, nproc=4)                         # real gloo ranks
"""

from distir.runtime.program import Program, compile, simulate

__all__ = ["Program", "compile", "launch", "simulate"]


def __getattr__(name: str):
    if name == "launch":
        from distir.runtime.launch import launch

        return launch
    raise AttributeError(name)
