"""impala_gpu: an IMPALA actor-learner reinforcement learning system in PyTorch."""

__version__ = "0.1.0"
