"""`distir-bench`: distir's collectives timed against raw torch.distributed.

    families.py  one declaration per family: programs, variants, inputs, the raw
                 baseline, the `raw clone+op` row, bus factor, exact reference
    runner.py    starts the ranks (distir.launch), checks and times every call
                 of a family side by side in one loop, builds the rows
    dispatch.py  the 1-rank chain of 1,000 ops: us/op Program.run adds over raw
    report.py    table, JSON, one busbw plot per family
    cli.py       the command line (nccl-tests options)
    sizes.py     4K/16M parsing, printing and the -b/-e/-f sweep

Nothing here is imported by the rest of distir.
"""
