"""`dist.all_reduce` (native kinds and combine regions, its algorithms) and the ciphertext sum
`dist.all_reduce_add_ciphertext`."""
