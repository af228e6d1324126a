"""`dist.gather` and `dist.scatter`: rows along an axis, to and from a root."""
