"""`dist.all_gather`: every rank's tensor, concatenated along an axis in rank order."""
