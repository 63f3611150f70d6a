"""Reporting: metrics, telemetry, the console, tuning hints, network health, checkpoints."""
