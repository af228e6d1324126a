"""Point-to-point: `dist.send`, `dist.recv`, `dist.sendrecv`."""
