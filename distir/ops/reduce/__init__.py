"""`dist.reduce`: the reduction of every rank's tensor, on the root."""
