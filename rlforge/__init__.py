"""rlforge: reinforcement-learning post-training of large language models.

The package is organised as the RL step is (see docs/architecture.md):
config -> data -> rollout -> rewards -> algorithms -> engine -> trainer.
"""

__version__ = "0.1.0"
