"""PROPEL at smoke scale on CPU: labelled corpus, probe, and a short generator GRPO run with audits.

  python launch/build_corpus.py --config configs/propel_cpu.py
  python launch/fit_probe.py --config configs/propel_cpu.py
  python launch/train_generator.py --config configs/propel_cpu.py

The solver is the LEAP policy of the main job (`make train` writes it to workdirs/default/policy). A
135M policy passes level-0 tasks (complete a kernel body) and no level-1 task, so on CPU the generator
writes level-0 tasks: that is where this solver's frontier is. Numbers from these sizes (N = 32 tasks,
16 RVP samples, 8 audit tasks, 2 RL steps) are smoke-scale results, not paper-scale measurements;
`configs/propel_h200.py` has the paper's sizes and levels 1-3.
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
  c.generator.model.remat = "full"  # generator RL backpropagates through ~1.1k-token sequences
  c.generator.levels = (0,)  # levels of generated tasks (suite examples shown from the same levels)
  c.generator.num_shots = 2  # suite tasks (solutions and skeletons removed) shown per prompt
  c.generator.max_new_tokens = 384  # level-0 task files are ~250 tokens (the harness writes the skeleton)
  c.generator.max_context_len = 2048
  c.generator.temperature = 0.8  # at 1.0 the 135M generator breaks the format in 15 of 16 samples
  c.generator.top_p = 1.0
  c.generator.batch_size = 16  # generations per sampler call
  c.generator.sft = ml_collections.ConfigDict()  # cold start: the 135M model answers the prompt with prose
  c.generator.sft.enabled = True  # fine-tune on suite task files into <workdir>/generator_sft on first use
  c.generator.sft.steps = 10
  c.generator.sft.batch_size = 2
  c.generator.sft.per_task = 2  # prompts (different shots) per suite task
  c.generator.sft.optim = common.optim()
  c.generator.sft.optim.learning_rate = 1e-4
  c.generator.sft.optim.warmup_steps = 1

  c.solver = ml_collections.ConfigDict()  # the solver whose pass rates define the frontier
  c.solver.model = model_section("workdirs/default/policy")  # the LEAP policy (HF folder) of `make train`
  c.solver.attempts = 8  # K
  c.solver.episode_mode = False  # False: an attempt is one turn-1 sample; True: a full T-turn episode
  c.solver.num_turns = 3  # T in episode mode
  c.solver.temperature = 1.3  # the solver's sampling temperature (configs/default.py rollout.temperature)
  c.solver.top_p = 1.0
  c.solver.max_new_tokens = 128  # as configs/default.py: level-0 answers are ~20 tokens
  c.solver.max_context_len = 3072
  c.solver.context = "episode"

  c.evaluator = ml_collections.ConfigDict()
  c.evaluator.workers = 2
  c.evaluator.timeout_s = 0.0
  c.evaluator.isolation = "namespaces"  # "process": opt out of kernel-level isolation (machines without namespaces)

  c.corpus = ml_collections.ConfigDict()
  c.corpus.num_tasks = 64  # N generations labelled (invalid ones included, with their reason)
  # y = 1[a <= passes <= b] of K. PROPEL's 1..3 of 8 is empty here: the 135M solver passes 5-8 of 8 on every
  # valid generated level-0 task. 1..7 is the band in which a LEAP group of 8 carries a gradient (neither
  # all-pass nor all-fail; DCP's activation range with t_max = G - 1). propel_h200.py keeps 1..3.
  c.corpus.band = (1, 7)
  c.corpus.dir = ""  # "" = <workdir>/corpus

  c.probe = ml_collections.ConfigDict()
  c.probe.layers = ()  # residual streams tried; () = about a third of the depth
  c.probe.l2s = (1e-3, 1e-2, 1e-1)
  c.probe.hidden = 0  # > 0: one-hidden-layer MLP probe of this width
  c.probe.steps = 500
  c.probe.cv_folds = 5  # grouped cross-validation folds (fewer when there are fewer groups)
  c.probe.cv_groups = "reference"  # tasks sharing a normalised reference share a fold; "family": an op family
  c.probe.alpha = 0.05  # eligible: AUROC lower bound at level alpha / #candidates above 0.5 (probe/selection.py)
  c.probe.allow_ineligible = False  # train_generator.py: True trains on a probe with no demonstrated skill
  c.probe.rvp_samples = 16  # base-generator generations over which RVP (reward variance) is measured
  c.probe.r_bad = -0.2  # on the reward scale: std units of the probe's logits over the RVP sample's valid tasks
  c.probe.max_tokens = 2048  # rendered task text cut to this many tokens
  c.probe.second_probe = ""  # path of another probe .npz: reward = min over both (worst case)

  c.rl = ml_collections.ConfigDict()
  c.rl.steps = 2
  c.rl.num_prompts = 2  # P prompts per step
  c.rl.group_size = 4  # G generations per prompt
  c.rl.audit_every = 2  # real-solver audit every this many steps (and before step 0)
  c.rl.audit_tasks = 8  # M
  c.rl.export_dir = ""  # task folder of valid generated tasks; "" = <workdir>/generated_tasks

  c.optim = common.optim()
  c.optim.learning_rate = 1e-5  # two steps at CPU sizes; propel_h200.py uses 1e-6 over 200
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
