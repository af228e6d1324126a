"""`dist.pvary` and `dist.psum`: replication, as autodiff sees it (Megatron's f and g)."""
