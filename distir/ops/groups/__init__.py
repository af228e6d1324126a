"""Group declarations (`dist.group`) and the rank queries (`dist.rank`, `dist.group_size`)."""
