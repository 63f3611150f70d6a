"""Channels between processes: the trajectory ring (actors -> learner) and the parameter
store (learner -> actors)."""
