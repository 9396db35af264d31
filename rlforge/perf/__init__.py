"""Performance measurement: stage timers (FLOPs/MFU and GPU sampling come later)."""
