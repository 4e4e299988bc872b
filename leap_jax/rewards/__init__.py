"""Reward core for grouped multi-turn rollouts: pure, jittable jax/chex/numpy functions.

Arrays are laid out [P, G] or [P, G, T] (problems, samples per group, turns). `valid` marks
samples that the evaluator judged (no infrastructure error); invalid ones are excluded from
every count and ranking and get zero reward and advantage.
"""
from leap_jax.rewards.advantages import any_turn_success_reward
from leap_jax.rewards.advantages import grpo_advantages
from leap_jax.rewards.advantages import kevin_returns
from leap_jax.rewards.advantages import rloo_advantages
from leap_jax.rewards.advantages import trloo_advantages
from leap_jax.rewards.dcp import dcp_gate
from leap_jax.rewards.dcp import dcp_keep_mask
from leap_jax.rewards.dcp import dcp_next_turn
from leap_jax.rewards.leap import leap_rewards
from leap_jax.rewards.leap import LeapRewards
from leap_jax.rewards.leap import turn_advantages
from leap_jax.rewards.rank import first_pass_turn
from leap_jax.rewards.rank import rank_reward

__all__ = (
    "LeapRewards",
    "any_turn_success_reward",
    "dcp_gate",
    "dcp_keep_mask",
    "dcp_next_turn",
    "first_pass_turn",
    "grpo_advantages",
    "kevin_returns",
    "leap_rewards",
    "rank_reward",
    "rloo_advantages",
    "trloo_advantages",
    "turn_advantages",
)
