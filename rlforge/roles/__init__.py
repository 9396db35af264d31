"""Roles of the RL step (actor, reference, critic), each driving a TrainEngine."""
