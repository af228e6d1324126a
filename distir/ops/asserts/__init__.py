"""The assertions: `dist.assert_reduced` (local) and `dist.assert_uniform` (collective)."""
