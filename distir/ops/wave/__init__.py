"""`dist.wave` (submits several collectives before awaiting any) and `dist.yield`."""
