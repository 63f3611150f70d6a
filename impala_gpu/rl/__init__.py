"""Pure RL functions: V-trace and the losses, time-major ``[T, B]``."""
