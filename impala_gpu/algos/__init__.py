"""Training algorithms sharing envs, models, the ring and logging: impala (async + V-trace)."""
