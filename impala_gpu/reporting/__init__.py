"""Reporting: what a run writes and prints: metrics (metrics.jsonl, TensorBoard, W&B), events,
the console's progress line and end summary, network-health warnings, checkpoints."""
