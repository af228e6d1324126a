"""`dist.broadcast`: every rank gets the root's tensor."""
