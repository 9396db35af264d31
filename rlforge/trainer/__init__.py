"""The RL step loop, validation, checkpointing and the verl-compatible entry point."""
