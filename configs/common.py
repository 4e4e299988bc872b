"""Config sections shared by the training configs; each function returns one ConfigDict section.

Compose them in a `get_config()`: `config.optim = common.optim()`, `config.learner = common.learner()`, ...
"""
import ml_collections


def optim() -> ml_collections.ConfigDict:
  """AdamW, global-norm clipping, warmup + cosine schedule, gradient accumulation."""
  c = ml_collections.ConfigDict()
  c.learning_rate = 1e-6      # peak learning rate (LEAP reports 1e-6 for a 7B policy).
  c.warmup_steps = 0          # optimiser updates of linear warmup from lr / warmup_steps to lr.
  c.decay_steps = 0           # update at which the cosine decay ends (> warmup_steps); 0 = constant lr after warmup.
  c.end_ratio = 0.1           # final lr as a fraction of the peak when decaying.
  c.b1 = 0.9                  # Adam first-moment decay.
  c.b2 = 0.999                # Adam second-moment decay.
  c.eps = 1e-8                # Adam denominator epsilon.
  c.weight_decay = 0.0        # decoupled weight decay on matrices (ndim >= 2) only.
  c.max_grad_norm = 1.0       # clip the gradient to this global L2 norm; 0 disables clipping.
  c.grad_accum_steps = 1      # microbatches per minibatch whose gradients are summed before one update.
  return c


def learner() -> ml_collections.ConfigDict:
  """Clipped policy-gradient objective (PPO / GRPO / DAPO / Dr. GRPO options)."""
  c = ml_collections.ConfigDict()
  c.mu = 1                    # passes (epochs) over each batch; > 1 reuses samples, where the clip matters.
  c.num_minibatches = 1       # optimiser updates per pass; the batch must split into
  #                             num_minibatches * grad_accum_steps equal parts (each divisible by the data shards).
  c.eps_low = 0.2             # lower clip: ratio >= 1 - eps_low.
  c.eps_high = 0.2            # upper clip: ratio <= 1 + eps_high (DAPO clip-higher uses 0.28).
  c.tis_cap = 0.0             # > 0: truncated importance weight min(pi_learner / pi_sampler, tis_cap) on each token,
  #                             and the PPO ratio is taken against the learner's own log-probs at batch start.
  c.kl_beta = 0.0             # weight of the k3 KL penalty to a frozen reference; 0 skips the reference forward.
  c.ref_dtype = ""            # the reference's parameter dtype: "" = the policy's, "bfloat16" halves its memory.
  c.aggregation = "token_mean"  # "token_mean" | "sequence_mean" (GRPO) | "constant" (Dr. GRPO, divides by norm_length).
  c.norm_length = 0           # per-episode token budget for "constant" (required there, e.g. turns x max_new_tokens).
  c.shuffle = True            # reshuffle episodes into minibatches at every pass.
  c.shared_prefix = True      # run each group's shared prompt once (same log-probs and gradients, fewer tokens).
  c.drop_zero_advantage = False  # leave episodes whose advantages are all 0 out of the train batch (no
  #                             gradient without KL; DAPO's dynamic sampling); ignored when kl_beta > 0.
  return c


def checkpoint() -> ml_collections.ConfigDict:
  """Orbax checkpointing in `<workdir>/checkpoints`."""
  c = ml_collections.ConfigDict()
  c.every = 50                # save every this many train steps (and always on SIGTERM and at the end).
  c.keep = 3                  # number of most recent checkpoints kept on disk.
  c.async_save = True         # write checkpoints in a background thread.
  c.export_hf = True          # at the end, also write the policy as a HF folder `<workdir>/policy`.
  return c


def metrics() -> ml_collections.ConfigDict:
  """Per-step logging and episode dumps in the workdir."""
  c = ml_collections.ConfigDict()
  c.tensorboard = True        # write TensorBoard events to `<workdir>/tb`.
  c.progress_bar = True       # tqdm bar with the key numbers.
  c.episode_dumps = True      # write sampled code and feedback per turn to `<workdir>/episodes/step_<n>.jsonl`.
  c.episode_dump_every = 10   # dump episodes every this many steps.
  c.episodes_per_dump = 16    # episodes written per dump.
  c.plot_at_end = True        # write PNG curves to `<workdir>/plots` when training ends.
  return c
