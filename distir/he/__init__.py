"""Homomorphic-encryption support: RNS modular arithmetic (`modular`, torch-free, and `rns`), SEAL interop (`seal`) and threshold keys (`threshold`)."""
