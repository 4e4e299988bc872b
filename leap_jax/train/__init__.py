"""Learner side of training: policy-gradient objective, optimiser, sharded train step, checkpoints."""
