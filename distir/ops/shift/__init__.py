"""`dist.shift`: every rank's tensor moves `offset` ranks along the group."""
