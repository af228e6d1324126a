"""Meshes (`dist.mesh`) and layout transfers between them (`dist.transfer`)."""
