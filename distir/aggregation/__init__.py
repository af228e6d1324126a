"""Secure aggregation protocols built from distir programs (above the runtime).

:mod:`distir.aggregation.threshold`: threshold CKKS, t-out-of-N, with an
outside receiver; :mod:`distir.aggregation.channels`: the pairwise
authenticated encrypted channels its secrets travel over.
"""
