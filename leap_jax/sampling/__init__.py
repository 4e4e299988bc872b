"""Chat rendering, episode records, the batched multi-turn sampler and the learner's token log-probs."""
from leap_jax.sampling.buckets import bucket_length
from leap_jax.sampling.chat import ChatFormat
from leap_jax.sampling.episode import Episode, stack_episodes
from leap_jax.sampling.logprobs import sequence_logprobs, token_logprobs
from leap_jax.sampling.sampler import (FINISH_REASONS, Completion, Sampler, SamplerState, SamplingParams,
                                       row_keys, sample_logits)
