"""A run's life, the same for every algorithm: its dir claimed for it alone (``rundir``), then
continued from a checkpoint or started, reported, stopped by one rule, checkpointed and ended
with its summary (``run``). What it writes and prints along the way is ``reporting``'s."""
