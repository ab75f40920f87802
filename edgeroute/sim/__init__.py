"""Discrete-event simulators that drive the very same policy objects as the gateway."""
