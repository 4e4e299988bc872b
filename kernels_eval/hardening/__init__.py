"""Adversarial and broken candidates with the verdicts the evaluator must give them (test oracles)."""
