"""PROPEL at smoke scale on CPU: labelled corpus, probe, and a short generator GRPO run with audits.

  python launch/build_corpus.py --config configs/propel_cpu.py
  python launch/fit_probe.py --config configs/propel_cpu.py
  python launch/train_generator.py --config configs/propel_cpu.py

The solver is the LEAP policy of the main job (`make train` writes it to workdirs/default/policy). A
135M policy passes level-0 tasks (complete a kernel body) and no level-1 task, so on CPU the generator
writes level-0 tasks: that is where this solver's frontier is. Numbers from these sizes (N = 64 tasks,
16 RVP samples, 8 audit tasks, 2 RL steps) are smoke-scale results, not paper-scale measurements;
`configs/propel_h200.py` has the paper's sizes and levels 1-3.
"""
import ml_collections

from configs import common
from configs import default


def model_section(base: str = "smollm2-135m-instruct") -> ml_collections.ConfigDict:
  """A `model` section as in configs/default.py (base: embedded name, HF folder, .gguf, or "random")."""
  m = default.model()
  m.base = base
  m.remat = "none"
  return m


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.scale = "smoke"  # printed with every result: "smoke" (CPU sizes) or "paper"
  c.workdir = "workdirs/propel_cpu"  # corpus/, probe/, generator/, features/ live here
  c.lang = "pallas"
  c.generator = generator()  # the frozen reference generator (also the RL start point)
  c.solver = solver()  # the solver whose pass rates define the frontier
  c.evaluator = evaluator()
  c.corpus = corpus()
  c.probe = probe()
  c.rl = rl()
  c.optim = optim()
  c.learner = learner()
  c.checkpoint = checkpoint()
  c.metrics = metrics()
  return c


def generator() -> ml_collections.ConfigDict:
  """The generator's weights, the levels and shots of its prompts, its sampling and its cold-start SFT."""
  c = ml_collections.ConfigDict()
  c.model = model_section()
  c.model.remat = "full"  # generator RL backpropagates through ~1.1k-token sequences
  c.levels = (0,)  # levels of generated tasks (suite examples shown from the same levels)
  c.num_shots = 2  # suite tasks (solutions and skeletons removed) shown per prompt
  c.max_new_tokens = 384  # level-0 task files are ~250 tokens (the harness writes the skeleton)
  c.max_context_len = 2048
  c.temperature = 0.8  # at 1.0 the 135M generator breaks the format in 15 of 16 samples
  c.top_p = 1.0
  c.batch_size = 16  # generations per sampler call
  c.sft = generator_sft()  # cold start: the 135M model answers the prompt with prose
  return c


def generator_sft() -> ml_collections.ConfigDict:
  """`generator.sft`: fine-tuning of the generator on suite task files."""
  c = ml_collections.ConfigDict()
  c.enabled = True  # fine-tune on suite task files into <workdir>/generator_sft on first use
  c.steps = 10
  c.batch_size = 2
  c.per_task = 2  # prompts (different shots) per suite task
  c.optim = common.optim()
  c.optim.learning_rate = 1e-4
  c.optim.warmup_steps = 1
  return c


def solver() -> ml_collections.ConfigDict:
  """The solver's weights, its K attempts per task and their sampling."""
  c = ml_collections.ConfigDict()
  c.model = model_section("workdirs/default/policy")  # the LEAP policy (HF folder) of `make train`
  c.attempts = 8  # K
  c.episode_mode = False  # False: an attempt is one turn-1 sample; True: a full T-turn episode
  c.num_turns = 3  # T in episode mode
  c.temperature = 1.3  # the solver's sampling temperature (configs/default.py rollout.temperature)
  c.top_p = 1.0
  c.max_new_tokens = 128  # as configs/default.py: level-0 answers are ~20 tokens
  c.max_context_len = 3072
  c.context = "episode"
  return c


def evaluator() -> ml_collections.ConfigDict:
  """The sandboxed evaluator of generated tasks and solver attempts."""
  c = ml_collections.ConfigDict()
  c.workers = 2
  c.timeout_s = 0.0
  c.isolation = "namespaces"  # "process": opt out of kernel-level isolation (machines without namespaces)
  return c


def corpus() -> ml_collections.ConfigDict:
  """The labelled corpus: N generated tasks, each labelled by the solver's passes out of K."""
  c = ml_collections.ConfigDict()
  c.num_tasks = 64  # N generations labelled (invalid ones included, with their reason)
  # y = 1[a <= passes <= b] of K. PROPEL's 1..3 of 8 is empty here: the 135M solver passes 5-8 of 8 on every
  # valid generated level-0 task. 1..7 is the band in which a LEAP group of 8 carries a gradient (neither
  # all-pass nor all-fail; DCP's activation range with t_max = G - 1). propel_h200.py keeps 1..3.
  c.band = (1, 7)
  c.dir = ""  # "" = <workdir>/corpus
  return c


def probe() -> ml_collections.ConfigDict:
  """The probe on the generator's residual stream, its selection, and the RL reward built from it."""
  c = ml_collections.ConfigDict()
  c.layers = ()  # residual streams tried; () = about a third of the depth
  c.l2s = (1e-3, 1e-2, 1e-1)
  c.hidden = 0  # > 0: one-hidden-layer MLP probe of this width
  c.steps = 500
  c.cv_folds = 5  # grouped cross-validation folds (fewer when there are fewer groups)
  c.cv_groups = "reference"  # tasks sharing a normalised reference share a fold; "family": an op family
  c.alpha = 0.05  # eligible: AUROC lower bound at level alpha / #candidates above 0.5 (probe/selection.py)
  c.allow_ineligible = False  # train_generator.py: True trains on a probe with no demonstrated skill
  c.rvp_samples = 16  # base-generator generations over which RVP (reward variance) is measured
  c.r_bad = -0.2  # on the reward scale: std units of the probe's logits over the RVP sample's valid tasks
  c.max_tokens = 2048  # rendered task text cut to this many tokens
  c.second_probe = ""  # path of another probe .npz: reward = min over both (worst case)
  return c


def rl() -> ml_collections.ConfigDict:
  """Generator GRPO against the probe reward, with real-solver audits."""
  c = ml_collections.ConfigDict()
  c.steps = 2
  c.num_prompts = 2  # P prompts per step
  c.group_size = 4  # G generations per prompt
  c.audit_every = 2  # real-solver audit every this many steps (and before step 0)
  c.audit_tasks = 8  # M
  c.export_dir = ""  # task folder of valid generated tasks; "" = <workdir>/generated_tasks
  return c


def optim() -> ml_collections.ConfigDict:
  """The generator's RL optimiser."""
  c = common.optim()
  c.learning_rate = 1e-5  # two steps at CPU sizes; propel_h200.py uses 1e-6 over 200
  return c


def learner() -> ml_collections.ConfigDict:
  """The generator's RL objective."""
  c = common.learner()
  c.kl_beta = 0.05  # PROPEL code setting (0.02 collapsed)
  c.aggregation = "sequence_mean"
  return c


def checkpoint() -> ml_collections.ConfigDict:
  """`common.checkpoint()` every 2 steps, written synchronously."""
  c = common.checkpoint()
  c.every = 2
  c.async_save = False
  return c


def metrics() -> ml_collections.ConfigDict:
  """`common.metrics()` without TensorBoard and progress bar."""
  c = common.metrics()
  c.tensorboard = False
  c.progress_bar = False
  return c
