"""Functional PPO/GRPO learner: one jitted step = mu passes x minibatches x accumulated microbatches.

Per policy token t of episode i (see `objectives` for the terms):

  loss = sum_{i,t} m_it [ w_it * L_it(theta) + beta * KL_it(theta) ] / d_it

with m the policy mask, L the clipped surrogate (PPO arXiv 1707.06347; asymmetric clip from DAPO
arXiv 2503.14476), w the truncated importance weight (1 when off), KL the k3 estimator to a frozen
reference (GRPO arXiv 2402.03300) and d the aggregation divisor (token mean, GRPO sequence mean, or
the Dr. GRPO constant arXiv 2503.20783). Advantages are per token: each turn's policy span carries
that turn's advantage, so a multi-turn episode is one sequence with piecewise-constant A_t.

The old policy: without truncated importance sampling, pi_old = the sampler's recorded log-probs
(so the first update's ratio is pi_theta / pi_sampler). With it (tis_cap > 0), pi_old = the learner's
own log-probs at the start of the batch and each token is weighted by min(pi_old / pi_sampler, cap).

The step is functional: parameters are an `nnx.State` (or any pytree) and the model enters only
through `logprob_fn(params, tokens[B, L], input_mask[B, L]) -> f32[B, L]`, the log-prob of token t
given tokens < t at the sampling temperature (`model_logprob_fn(graphdef)` for the policy Transformer),
and, for batches with group ids under `shared_prefix`, through
`group_logprob_fn(params, prefix_tokens[U, Lp], prefix_len[U], tokens[U, R, Ls], mask[U, R, Ls],
episodes[U, R, Ls], offsets[U, R, Ls]) -> f32[U, R, Ls]`, the same log-probs with each unit's shared prompt run
once and its suffixes packed into slots (`leap_jax.train.grouping`).
The loss is a sum over policy tokens, so both layouts give the same loss and gradients.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from leap_jax.metrics.compile_time import compile_seconds
from leap_jax.sampling.logprobs import sequence_logprobs
from leap_jax.sampling.shared_prefix import grouped_sequence_logprobs
from leap_jax.train import grouping, objectives
from leap_jax.train import sharding as sharding_lib
from leap_jax.train.batch import TrainBatch

LogProbFn = Callable[[Any, jax.Array, jax.Array], jax.Array]
GroupLogProbFn = Callable[[Any, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def model_logprob_fn(graphdef: nnx.GraphDef, *, temperature: float = 1.0,
                     chunk_size: Optional[int] = 256) -> LogProbFn:
  """`logprob_fn(params, tokens[B, L], input_mask[B, L]) -> f32[B, L]` for a `Transformer` graphdef.

  Uses `leap_jax.sampling.sequence_logprobs` (the sampler's own definition, chunked over the
  vocabulary projection), so learner and sampler log-probs agree up to numerics.
  """
  return functools.partial(_model_logprobs, graphdef, temperature, chunk_size)


def _model_logprobs(graphdef, temperature, chunk_size, params, tokens, input_mask):
  return sequence_logprobs(graphdef, params, tokens, input_mask, temperature=temperature, chunk_size=chunk_size)


def model_group_logprob_fn(graphdef: nnx.GraphDef, *, temperature: float = 1.0,
                           chunk_size: Optional[int] = 256) -> GroupLogProbFn:
  """`group_logprob_fn(params, prefix_tokens[U, Lp], prefix_len[U], tokens[U, R, Ls], mask[U, R, Ls],
  episodes[U, R, Ls], offsets[U, R, Ls]) -> f32[U, R, Ls]` for a `Transformer` graphdef:
  `grouped_sequence_logprobs`' suffix log-probs of packed slots (each episode its own segment)."""
  return functools.partial(_model_group_logprobs, graphdef, temperature, chunk_size)


def _model_group_logprobs(graphdef, temperature, chunk_size, params, prefix_tokens, prefix_len, tokens, mask,
                          episodes, offsets):
  return grouped_sequence_logprobs(graphdef, params, prefix_tokens, prefix_len, tokens, mask,
                                   temperature=temperature, chunk_size=chunk_size, suffix_segments=episodes,
                                   suffix_offsets=offsets)[1]


@flax.struct.dataclass
class TrainState:
  """Everything a train step reads and replaces.

  step: int32[] train steps (batches) done.
  params: the policy parameters (an nnx.State or any pytree of arrays).
  opt_state: the optax state for `params`.
  rng: uint32[2] key for minibatch shuffling.
  """
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """Objective and update schedule; fields documented in `configs/common.py` (section `learner`, and
  `optim.grad_accum_steps`). `ref_dtype` and `drop_zero_advantage` are read by the loop, not the step."""
  mu: int = 1
  num_minibatches: int = 1
  grad_accum_steps: int = 1
  eps_low: float = 0.2
  eps_high: float = 0.2
  tis_cap: float = 0.0
  kl_beta: float = 0.0
  aggregation: str = "token_mean"
  norm_length: int = 0
  shuffle: bool = True
  shared_prefix: bool = True
  ref_dtype: str = ""
  drop_zero_advantage: bool = False

  def __post_init__(self):
    for name in ("mu", "num_minibatches", "grad_accum_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"learner {name} must be >= 1, got {getattr(self, name)}")
    if not 0 <= self.eps_low < 1:
      raise ValueError(f"learner eps_low must be in [0, 1), got {self.eps_low}")
    if self.eps_high < 0:
      raise ValueError(f"learner eps_high must be >= 0, got {self.eps_high}")
    if self.tis_cap < 0 or self.kl_beta < 0 or self.norm_length < 0:
      raise ValueError(f"learner tis_cap, kl_beta, norm_length must be >= 0, got "
                       f"{self.tis_cap}, {self.kl_beta}, {self.norm_length}")
    if self.aggregation not in objectives.AGGREGATIONS:
      raise ValueError(f"learner aggregation {self.aggregation!r} not in {objectives.AGGREGATIONS}")
    if self.aggregation == "constant" and self.norm_length == 0:
      raise ValueError("learner aggregation 'constant' needs learner.norm_length > 0, the per-episode token budget "
                       "(a batch's padded length would make the loss scale depend on padding)")

  @property
  def updates_per_step(self) -> int:
    return self.mu * self.num_minibatches


def row_multiple(config: LearnerConfig, mesh: Optional[Mesh]) -> int:
  """A batch's rows (or shared-prefix units) come in a multiple of this: minibatches x microbatches x the data
  shards of the mesh (every microbatch splits over the shards)."""
  shards = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
  return config.num_minibatches * config.grad_accum_steps * shards


def _strided_split(x: jax.Array, parts: int) -> jax.Array:
  """[B, ...] -> [parts, B / parts, ...] with part k = rows k, k + parts, k + 2 parts, ...

  Strided rather than contiguous, so every part stays spread over the batch shards of the mesh.
  """
  return jnp.swapaxes(x.reshape((x.shape[0] // parts, parts) + x.shape[1:]), 0, 1)


def _strided_merge(x: jax.Array) -> jax.Array:
  """Inverse of `_strided_split`: [parts, R, ...] -> [parts * R, ...]."""
  return jnp.swapaxes(x, 0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


# Per-token arrays the inner loop slices into minibatches and microbatches: [B, L] rows, or [U, R, Ls] units
# with their prefixes (`inputs` are the log-prob function's arguments after params).
@flax.struct.dataclass
class _Tokens:
  inputs: tuple[jax.Array, ...]
  policy_mask: jax.Array
  advantages: jax.Array
  old_logprobs: jax.Array
  sampler_logprobs: jax.Array
  is_weight: jax.Array
  ref_logprobs: Optional[jax.Array]  # None when kl_beta == 0
  divisor: jax.Array
  grouped: bool = flax.struct.field(pytree_node=False, default=False)


class Learner:
  """Builds the train state and runs jitted, buffer-donating train steps.

  Usage:
    learner = Learner.for_model(graphdef, make_optimizer(OptimConfig(...)), LearnerConfig(...), mesh=mesh)
    state = learner.init_state(params, seed, param_specs)
    ref = learner.reference_params(params, param_specs)   # only when kl_beta > 0 (else pass None)
    state, metrics = learner.step(state, batch, ref)      # metrics: dict of float

  A host batch with group ids runs in the shared-prefix layout when `config.shared_prefix` (and a
  `group_logprob_fn` is given); otherwise, and for batches already on devices, row by row.
  """

  def __init__(self, logprob_fn: LogProbFn, optimizer: optax.GradientTransformation, config: LearnerConfig, *,
               mesh: Optional[Mesh] = None, lr_schedule: Optional[optax.Schedule] = None,
               group_logprob_fn: Optional[GroupLogProbFn] = None):
    self.logprob_fn = logprob_fn
    self.group_logprob_fn = group_logprob_fn
    self.optimizer = optimizer
    self.config = config
    self.mesh = mesh
    self.lr_schedule = lr_schedule
    self._jitted = None

  @classmethod
  def for_model(cls, graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, config: LearnerConfig, *,
                temperature: float = 1.0, chunk_size: Optional[int] = 256, mesh: Optional[Mesh] = None,
                lr_schedule: Optional[optax.Schedule] = None) -> "Learner":
    """The learner of a `Transformer` graphdef, with both the per-row and the shared-prefix log-probs."""
    return cls(model_logprob_fn(graphdef, temperature=temperature, chunk_size=chunk_size), optimizer, config,
               mesh=mesh, lr_schedule=lr_schedule,
               group_logprob_fn=model_group_logprob_fn(graphdef, temperature=temperature, chunk_size=chunk_size))

  def state_shardings(self, params: Any, param_specs: Any = None) -> Any:
    """NamedShardings of the TrainState for `params` (arrays or ShapeDtypeStructs); None without a mesh."""
    if self.mesh is None:
      return None
    abstract = jax.eval_shape(self._fresh_state, params, jax.random.PRNGKey(0))
    p_shard = sharding_lib.param_shardings(abstract.params, self.mesh, param_specs)
    replicated = NamedSharding(self.mesh, P())
    return TrainState(
        step=replicated, params=p_shard, rng=replicated,
        opt_state=sharding_lib.opt_state_shardings(self.optimizer, abstract.opt_state, self.mesh, p_shard))

  def abstract_state(self, params: Any, param_specs: Any = None) -> TrainState:
    """ShapeDtypeStructs (with shardings under a mesh) of the TrainState: the restore target."""
    abstract = jax.eval_shape(self._fresh_state, params, jax.random.PRNGKey(0))
    shardings = self.state_shardings(params, param_specs)
    if shardings is None:
      return abstract
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)

  def init_state(self, params: Any, seed: int, param_specs: Any = None) -> TrainState:
    """Fresh TrainState (step 0, new optimizer state) placed on the mesh."""
    key = jax.random.PRNGKey(seed)
    shardings = self.state_shardings(params, param_specs)
    return jax.jit(self._fresh_state, out_shardings=shardings)(params, key)

  def _fresh_state(self, params, key):
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params), rng=key)

  def reference_params(self, params: Any, param_specs: Any = None, dtype: Optional[str] = None) -> Any:
    """A frozen copy of `params` to pass as `step(..., ref_params=)`: its own buffers (steps donate the policy's),
    sharded like the policy under the mesh, floating leaves cast to `dtype` when given ("bfloat16" halves it)."""
    def cast(x):
      return x.astype(dtype) if dtype and jnp.issubdtype(x.dtype, jnp.floating) else x
    shardings = None if self.mesh is None else sharding_lib.param_shardings(params, self.mesh, param_specs)
    return jax.jit(lambda p: jax.tree.map(cast, p), out_shardings=shardings)(params)

  def step(self, state: TrainState, batch: TrainBatch, ref_params: Any = None) -> tuple[TrainState, dict[str, float]]:
    """One train step on `batch`; `state` is donated (do not reuse it). Returns (new_state, metrics).

    `batch` holds host arrays (this process's rows under several processes), or already-sharded global
    arrays of a TrainBatch (run row by row) or of a `layout`'s GroupedBatch. `ref_params` is needed only
    when kl_beta > 0 and the batch has no ref_logprobs.
    Besides the loss terms, metrics hold the layout's `learner/positions`, `learner/padding_share` and
    `learner/positions_saved` (host batches), and `time/learn_compile`, seconds spent compiling the step.
    """
    layout = {}
    if not isinstance(batch.tokens, jax.Array):
      batch, stats = self.layout(batch.validate())
      layout = stats.metrics()
      if self.mesh is not None:
        batch = sharding_lib.shard_batch(batch, self.mesh)
    elif isinstance(batch, TrainBatch) and batch.group_ids is not None:
      batch = batch.replace(group_ids=None)
    if self._jitted is None:
      out_state = jax.tree.map(lambda x: x.sharding, state) if self.mesh is not None else None
      out_metrics = NamedSharding(self.mesh, P()) if self.mesh is not None else None
      self._jitted = jax.jit(self._train_step, donate_argnums=0, out_shardings=(out_state, out_metrics))
    compiling = compile_seconds()
    new_state, metrics = self._jitted(state, batch, ref_params)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics.update(layout, **{"time/learn_compile": compile_seconds() - compiling})
    return new_state, metrics

  def layout(self, batch: TrainBatch) -> tuple[Any, grouping.LayoutStats]:
    """The host batch as the step will run it: `GroupedBatch` units when `shared_prefix` and the batch has group
    ids, else its rows; with the layout's token counts."""
    if not self.config.shared_prefix or batch.group_ids is None:
      return batch.replace(group_ids=None), grouping.LayoutStats.of_rows(batch)
    if self.group_logprob_fn is None:
      raise ValueError("learner.shared_prefix with a grouped batch needs a group_logprob_fn (Learner.for_model)")
    return grouping.group_batch(batch, row_multiple(self.config, self.mesh), _largest_over_processes)

  def _constrain(self, tree):
    if self.mesh is None:
      return tree
    return jax.lax.with_sharding_constraint(tree, sharding_lib.batch_sharding(self.mesh))

  def _train_step(self, state: TrainState, batch: TrainBatch, ref_params: Any):
    cfg = self.config
    size = batch.policy_mask.shape[0]
    minibatch = self._minibatch_size(size)
    data = self._token_data(state, batch, ref_params, minibatch // cfg.grad_accum_steps)
    rng, shuffle_rng = jax.random.split(state.rng)
    if cfg.shuffle:
      order = jnp.stack([jax.random.permutation(k, size) for k in jax.random.split(shuffle_rng, cfg.mu)])
    else:
      order = jnp.tile(jnp.arange(size), (cfg.mu, 1))
    order = order.reshape(cfg.updates_per_step, minibatch)  # [updates, minibatch] episode indices
    (params, opt_state), per_update = jax.lax.scan(
        functools.partial(self._update, data), (state.params, state.opt_state), order)
    metrics = self._metrics(per_update, state.step)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=rng), metrics

  def _minibatch_size(self, size: int) -> int:
    """Rows (or units) per minibatch; the batch must split into minibatches x microbatches, each over the data
    shards."""
    cfg = self.config
    if size % (cfg.num_minibatches * cfg.grad_accum_steps):
      raise ValueError(f"batch of {size} episodes does not split into num_minibatches={cfg.num_minibatches} x "
                       f"grad_accum_steps={cfg.grad_accum_steps} equal microbatches")
    minibatch = size // cfg.num_minibatches
    if self.mesh is not None:
      shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
      if (minibatch // cfg.grad_accum_steps) % shards:
        raise ValueError(f"microbatch of {minibatch // cfg.grad_accum_steps} episodes does not split over the "
                         f"{shards} data x fsdp shards of the mesh")
    return minibatch

  def _token_data(self, state: TrainState, batch: TrainBatch | grouping.GroupedBatch, ref_params: Any,
                  micro: int) -> _Tokens:
    """The per-token inputs of the loss ([B, L] or [U, R, Ls]): old log-probs (the sampler's, or the learner's own
    at batch start with truncated importance weights), importance weights and the reference's log-probs when
    kl_beta > 0."""
    cfg = self.config
    policy_mask = batch.policy_mask
    grouped = isinstance(batch, grouping.GroupedBatch)
    inputs = ((batch.prefix_tokens, batch.prefix_len, batch.tokens, policy_mask, batch.episodes, batch.offsets)
              if grouped else (batch.tokens, batch.input_mask))
    sampler_lp = jnp.where(policy_mask, batch.old_logprobs, 0.0).astype(jnp.float32)
    if cfg.tis_cap > 0:
      old_lp = self._frozen_logprobs(state.params, inputs, grouped, policy_mask, micro)
      is_weight = objectives.truncated_is_weight(old_lp, sampler_lp, cfg.tis_cap)
    else:
      old_lp, is_weight = sampler_lp, jnp.ones_like(sampler_lp)
    ref_lp = None
    if cfg.kl_beta > 0:
      if batch.ref_logprobs is not None:
        ref_lp = batch.ref_logprobs
      elif ref_params is not None:
        ref_lp = self._frozen_logprobs(ref_params, inputs, grouped, policy_mask, micro)
      else:
        raise ValueError("kl_beta > 0 needs TrainBatch.ref_logprobs or ref_params for the reference forward")
      ref_lp = jnp.where(policy_mask, ref_lp, 0.0).astype(jnp.float32)
    return _Tokens(
        inputs=inputs, policy_mask=policy_mask,
        advantages=jnp.where(policy_mask, batch.advantages, 0.0).astype(jnp.float32),
        old_logprobs=old_lp, sampler_logprobs=sampler_lp, is_weight=is_weight, ref_logprobs=ref_lp,
        divisor=jnp.ones_like(sampler_lp), grouped=grouped)

  def _update(self, data: _Tokens, carry, idx):
    """One optimiser update on minibatch `idx` (int[minibatch]): gradients summed in f32 over its microbatches."""
    cfg = self.config
    params, opt_state = carry
    mb = self._constrain(jax.tree.map(lambda x: jnp.take(x, idx, axis=0), data))
    norm = None if cfg.norm_length == 0 else cfg.norm_length
    rows = mb.policy_mask.reshape(-1, mb.policy_mask.shape[-1])  # units' slots are rows
    episodes = _minibatch_episodes(mb.inputs[4]).reshape(rows.shape) if mb.grouped else None
    divisor = objectives.aggregation_denominators(rows, cfg.aggregation, norm, episodes)
    mb = mb.replace(divisor=divisor.reshape(mb.policy_mask.shape))
    micro_data = jax.tree.map(lambda x: _strided_split(x, cfg.grad_accum_steps), mb)

    def accumulate(grads, m):
      (_, sums), g = jax.value_and_grad(self._loss, has_aux=True)(params, self._constrain(m))
      return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g), sums

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grads, sums = jax.lax.scan(accumulate, zeros, micro_data)
    sums = jax.tree.map(lambda x: x.sum(0), sums)
    sums["grad_norm"] = optax.global_norm(grads)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    updates, opt_state = self.optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), sums

  def _loss(self, params, m: _Tokens):
    """Minibatch-normalised loss of one microbatch and its metric sums (see the module docstring)."""
    cfg = self.config
    mask = m.policy_mask.astype(jnp.float32)
    logp = self._logprobs(params, m.inputs, m.grouped).astype(jnp.float32)
    logp = jnp.where(m.policy_mask, logp, 0.0)
    pg, clipped = objectives.clipped_surrogate(logp, m.old_logprobs, m.advantages, cfg.eps_low, cfg.eps_high)
    per_token = m.is_weight * pg
    sg = jax.lax.stop_gradient
    sums = {}
    if cfg.kl_beta > 0:
      kl = objectives.k3_kl(logp, m.ref_logprobs)
      per_token = per_token + cfg.kl_beta * kl
      sums["kl_ref"] = jnp.sum(mask * sg(kl))
    if cfg.tis_cap > 0:
      sums["is_weight"] = jnp.sum(mask * m.is_weight)
      sums["is_capped"] = jnp.sum(mask * (m.is_weight >= cfg.tis_cap))
    loss = jnp.sum(mask * per_token / m.divisor)
    gap = sg(logp) - m.sampler_logprobs
    sums.update({
        "loss": sg(loss),
        "tokens": mask.sum(),
        "pg_loss": jnp.sum(mask * sg(pg)),
        "clipped": jnp.sum(mask * clipped),
        "approx_kl": jnp.sum(mask * objectives.approx_kl(sg(logp), m.old_logprobs)),
        "gap": jnp.sum(mask * gap),
        "abs_gap": jnp.sum(mask * jnp.abs(gap)),
        "neg_logprob": jnp.sum(mask * -sg(logp)),
    })
    return loss, sums

  def _logprobs(self, params, inputs: tuple[jax.Array, ...], grouped: bool) -> jax.Array:
    return (self.group_logprob_fn if grouped else self.logprob_fn)(params, *inputs)

  def _frozen_logprobs(self, params, inputs: tuple[jax.Array, ...], grouped: bool, policy_mask: jax.Array,
                       rows: int) -> jax.Array:
    """Stop-gradient log-probs (shaped like policy_mask) on policy tokens, 0 elsewhere; `rows` rows or units per
    forward."""
    chunks = jax.tree.map(lambda x: _strided_split(x, policy_mask.shape[0] // rows), inputs)
    lp = jax.lax.map(lambda c: self._logprobs(params, self._constrain(c), grouped), chunks)  # [n, rows, ...]
    lp = _strided_merge(lp).astype(jnp.float32)
    return jax.lax.stop_gradient(jnp.where(policy_mask, lp, 0.0))

  def _metrics(self, per_update: dict[str, jax.Array], step: jax.Array) -> dict[str, jax.Array]:
    """Step metrics from per-update sums [U]: token means averaged over updates.

    logprob_gap (mean log pi_learner - log pi_sampler over policy tokens), its absolute value and
    the entropy proxy (mean -log pi of the sampled tokens) come from the first update, whose
    parameters are the ones that produced the batch.
    """
    tokens = jnp.maximum(per_update["tokens"], 1.0)
    mean = lambda k: jnp.mean(per_update[k] / tokens)
    first = lambda k: per_update[k][0] / tokens[0]
    out = {
        "loss": jnp.mean(per_update["loss"]),
        "pg_loss": mean("pg_loss"),
        "clip_fraction": mean("clipped"),
        "approx_kl": mean("approx_kl"),
        "grad_norm": jnp.mean(per_update["grad_norm"]),
        "logprob_gap": first("gap"),
        "logprob_gap_abs": first("abs_gap"),
        "entropy_proxy": first("neg_logprob"),
        "policy_tokens": jnp.sum(per_update["tokens"]) / self.config.mu,
    }
    if self.config.kl_beta > 0:
      out["kl_ref"] = mean("kl_ref")
    if self.config.tis_cap > 0:
      out["tis_weight"] = mean("is_weight")
      out["tis_capped_fraction"] = mean("is_capped")
    if self.lr_schedule is not None:
      out["learning_rate"] = self.lr_schedule((step + 1) * self.config.updates_per_step - 1)
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def _minibatch_episodes(local: jax.Array) -> jax.Array:
  """Unit-local suffix ids [U', R, Ls] (-1 padding) -> ids unique over the minibatch's units, below U' * R * Ls."""
  U, R, Ls = local.shape
  return jnp.where(local >= 0, local + (jnp.arange(U, dtype=local.dtype) * R * Ls)[:, None, None], -1)


def _largest_over_processes(shape: grouping.Shape) -> grouping.Shape:
  """The elementwise largest layout shape over processes (every process runs the same compiled step)."""
  if jax.process_count() == 1:
    return shape
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return tuple(int(x) for x in np.max(multihost_utils.process_allgather(np.asarray(shape)), axis=0))
