"""Training metrics: per-step writer (TensorBoard, metrics.jsonl, progress bar), episode dumps, rollout
statistics and PNG plots of a workdir.

Metric names the plots read (the rollout ones come from `rollout_stats.rollout_metrics`):
  pass_rate/turn_<k>, reward/mean, loss, groups/activated_share, time/<phase> (seconds per step).
"""
