"""PROPEL at smoke scale on CPU: labelled corpus, probe, and a short generator GRPO run with audits.

  python launch/build_corpus.py --config configs/propel_cpu.py
  python launch/fit_probe.py --config configs/propel_cpu.py
  python launch/train_generator.py --config configs/propel_cpu.py

Numbers from these sizes (N = 32 tasks, 64 RVP samples, 8 audit tasks) are smoke-scale results, not
paper-scale measurements; `configs/propel_h200.py` has the paper's sizes.
"""
import ml_collections

from configs import common
from configs import default


def model_section(base: str = "smollm2-135m-instruct") -> ml_collections.ConfigDict:
  """A `model` section as in configs/default.py (base: embedded name, HF folder, .gguf, or "random")."""
  m = default.get_config().model
  m.base = base
  m.remat = "none"
  return m


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.scale = "smoke"  # printed with every result: "smoke" (CPU sizes) or "paper"
  c.workdir = "workdirs/propel_cpu"  # corpus/, probe/, generator/, features/ live here
  c.lang = "pallas"

  c.generator = ml_collections.ConfigDict()  # the frozen reference generator (also the RL start point)
  c.generator.model = model_section()
  c.generator.num_shots = 2  # suite tasks (solutions removed) shown per prompt
  c.generator.max_new_tokens = 640
  c.generator.max_context_len = 4096
  c.generator.temperature = 1.0
  c.generator.top_p = 1.0
  c.generator.batch_size = 8  # generations per sampler call

  c.solver = ml_collections.ConfigDict()  # the solver whose pass rates define the frontier
  c.solver.model = model_section()  # base = a trained LEAP checkpoint folder (HF) for a trained solver
  c.solver.attempts = 8  # K
  c.solver.episode_mode = False  # False: an attempt is one turn-1 sample; True: a full T-turn episode
  c.solver.num_turns = 3  # T in episode mode
  c.solver.temperature = 1.3  # the solver's sampling temperature (configs/default.py rollout.temperature)
  c.solver.top_p = 1.0
  c.solver.max_new_tokens = 448
  c.solver.max_context_len = 3072
  c.solver.context = "episode"

  c.evaluator = ml_collections.ConfigDict()
  c.evaluator.workers = 2
  c.evaluator.timeout_s = 0.0

  c.corpus = ml_collections.ConfigDict()
  c.corpus.num_tasks = 32  # N generations labelled (invalid ones included, with their reason)
  c.corpus.band = (1, 3)  # y = 1[a <= passes <= b] of K
  c.corpus.dir = ""  # "" = <workdir>/corpus

  c.probe = ml_collections.ConfigDict()
  c.probe.layers = ()  # residual streams tried; () = about a third of the depth
  c.probe.l2s = (1e-3, 1e-2, 1e-1)
  c.probe.hidden = 0  # > 0: one-hidden-layer MLP probe of this width
  c.probe.steps = 500
  c.probe.heldout_fraction = 0.25
  c.probe.rvp_samples = 64  # base-generator generations over which RVP (reward variance) is measured
  c.probe.r_bad = -0.2
  c.probe.max_tokens = 2048  # rendered task text cut to this many tokens
  c.probe.second_probe = ""  # path of another probe .npz: reward = min over both (worst case)

  c.rl = ml_collections.ConfigDict()
  c.rl.steps = 4
  c.rl.num_prompts = 2  # P prompts per step
  c.rl.group_size = 4  # G generations per prompt
  c.rl.audit_every = 4  # real-solver audit every this many steps (and before step 0)
  c.rl.audit_tasks = 8  # M
  c.rl.export_dir = ""  # task folder of valid generated tasks; "" = <workdir>/generated_tasks

  c.optim = common.optim()
  c.optim.learning_rate = 1e-6
  c.learner = common.learner()
  c.learner.kl_beta = 0.05  # PROPEL code setting (0.02 collapsed)
  c.learner.aggregation = "sequence_mean"
  c.checkpoint = common.checkpoint()
  c.checkpoint.every = 2
  c.checkpoint.async_save = False
  c.metrics = common.metrics()
  c.metrics.tensorboard = False
  c.metrics.progress_bar = False
  return c
