"""Multi-turn rollouts for kernel-writing policies: task order, prompts, methods and the rollout harness."""
from leap_jax.rollout.harness import Rollout, RolloutBatch, RolloutSettings, request_id
from leap_jax.rollout.methods import METHODS, Method, credit, get_method
from leap_jax.rollout.task_pool import TaskPool
