"""Acting: actor processes step envs with a stale policy copy and write unrolls to the ring."""
