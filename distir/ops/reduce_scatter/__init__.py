"""`dist.reduce_scatter`: rank r gets part r of the reduction."""
