"""The main job on CPU: the embedded SmolLM2-135M-Instruct after cold-start SFT, LEAP on level-0/1
Pallas tasks, sized for a 2-core CPU (P*G = 8 episodes per step, a few steps, about 10-15 minutes).

Level-0 prompts are ~700 tokens and their answers (the line(s) that complete the skeleton) ~20 tokens;
level-1 prompts ~650 tokens and full solutions 340-600 tokens. SFT sees most level-0 train tasks but not
`sft.exclude_ids`, so the pool holds tasks the policy passes, tasks it passes sometimes and tasks it fails.

  python launch/train.py --config configs/default.py [--config.<field>=<value> ...]
"""
import ml_collections

from configs import common

# SmolLM2-135M-Instruct's architecture, for dry runs and random initialisation (`model.base = "random"`).
SMOLLM2_135M = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.workdir = "workdirs/default"  # relative to the working directory
  c.method = "leap"  # leap | leap_no_dcp | grpo | grpo_mt | kevin | trloo (see leap_jax/rollout/methods.py)
  c.steps = 4  # RL steps (rollout + learner update)
  c.model = model()
  c.tasks = tasks()
  c.rollout = rollout()
  c.dcp = dcp()
  c.evaluator = evaluator()
  c.sft = sft()
  c.precheck = precheck()
  c.heldout = heldout()
  c.mesh = mesh()
  c.distributed = distributed()
  c.optim = optim()
  c.learner = learner()
  c.checkpoint = checkpoint()
  c.metrics = metrics()
  return c


def model() -> ml_collections.ConfigDict:
  """The policy: which weights, their architecture and tokenizer, dtypes and rematerialisation."""
  c = ml_collections.ConfigDict()
  c.base = "smollm2-135m-instruct"  # embedded model name, HF checkpoint folder, .gguf file, or "random"
  c.arch = dict(SMOLLM2_135M)  # HF config.json dict: random init and dry runs without a checkpoint
  c.tokenizer = "smollm2-135m-instruct"  # tokenizer source when base = "random" (name or folder)
  c.dtype = "float32"
  c.param_dtype = "float32"
  c.scan_layers = True
  c.remat = "full"  # recompute layer activations in the backward pass (needed on CPU memory)
  return c


def tasks() -> ml_collections.ConfigDict:
  """The task pool of RL: language, levels, split, and optional ids or folder."""
  c = ml_collections.ConfigDict()
  c.lang = "pallas"  # pallas | cuda
  c.levels = (0, 1)
  c.split = "train"
  c.ids = ()  # restrict to these task ids (empty: all of the levels and split)
  c.folder = ""  # a task folder instead of the embedded suite (e.g. tasks exported by train_generator.py)
  # A local KernelBench clone instead (nothing is downloaded): levels, ids (kb<L>_<n>) and split select its
  # problems; the split is by id hash (kernels_eval/kernelbench/problems.py), train and eval never overlap.
  c.kernelbench_dir = ""
  c.kernelbench_tolerance = 1e-2  # KernelBench's atol = rtol
  return c


def rollout() -> ml_collections.ConfigDict:
  """Episodes per step (P tasks, G episodes each, T turns) and how they are sampled."""
  c = ml_collections.ConfigDict()
  c.num_problems = 2  # P tasks per step
  c.group_size = 4  # G episodes per task
  c.num_turns = 3  # T
  c.max_new_tokens = 128  # level-0 answers are ~20 tokens; level-1 sources (340+) are beyond this policy
  c.max_context_len = 3072  # KV-cache slots per episode (all turns)
  c.context = "episode"  # episode (whole conversation) | latest (statement + latest code + feedback)
  c.truncated_as = "failure"  # failure | invalid
  c.eval_retries = 2  # retries of evaluator infrastructure errors before a trajectory is invalid
  c.temperature = 1.3  # at 0.8-1.0 the SFT policy answers most level-0 tasks identically in a group
  c.top_p = 1.0
  c.top_k = 0
  c.overlap = "auto"  # auto: evaluation overlaps generation only with more than 2 cores | on | off
  return c


def dcp() -> ml_collections.ConfigDict:
  """DCP: groups whose turn-1 failures are in t_min..t_max continue to turns 2..T."""
  c = ml_collections.ConfigDict()
  c.t_min = -1  # -1: G/2 (rounded up)
  c.t_max = -2  # G - 1: all-fail groups (level-1 tasks are beyond a 135M policy) get no turns 2..T; -1: G
  return c


def evaluator() -> ml_collections.ConfigDict:
  """The sandboxed evaluator of generated kernels."""
  c = ml_collections.ConfigDict()
  c.workers = 2  # single-threaded sandboxed worker processes
  c.timeout_s = 0.0  # per-job wall limit; 0 = the backend's default
  c.isolation = "namespaces"  # "process": opt out of kernel-level isolation (machines without namespaces)
  return c


def sft() -> ml_collections.ConfigDict:
  """The cold-start SFT that RL starts from."""
  c = ml_collections.ConfigDict()
  c.enabled = True  # RL starts from the cold-start SFT checkpoint, trained first when missing
  c.checkpoint_dir = ""  # HF folder of the SFT model; "" = <workdir>/sft
  c.levels = (0,)  # train-split tasks of these levels ...
  c.extra_ids = ("row_mean", "transpose")  # ... plus these (a few level-1 tasks) ...
  c.exclude_ids = ("clamp", "scale", "sigmoid")  # ... minus these: pool tasks the policy must generalise to
  # Examples always come from the embedded suite (KernelBench problems have no trusted solutions), also with
  # tasks.kernelbench_dir: Pallas solutions there; with tasks.lang = "cuda" SFT stops with an error (the suite's
  # CUDA solutions are not KernelBench's ModelNew format): set enabled = False.
  c.steps = 6
  c.batch_size = 2
  c.prompt_grad = False  # False: truncated gradient, prompt prefilled without gradient (see train/sft.py)
  c.optim = common.optim()
  c.optim.learning_rate = 1e-4
  c.optim.warmup_steps = 1
  return c


def precheck() -> ml_collections.ConfigDict:
  """The turn-1 pass rate on the task pool, before RL (and after it)."""
  c = ml_collections.ConfigDict()
  c.enabled = True  # measure the turn-1 pass rate on the task pool before RL
  c.samples_per_task = 1
  c.after = True  # measure it again after the last step (same tasks and sampling keys)
  return c


def heldout() -> ml_collections.ConfigDict:
  """The held-out evaluation (Acc@k against cost)."""
  c = ml_collections.ConfigDict()
  c.split = "eval"  # held-out tasks for launch/eval.py and the end of training
  c.levels = (0, 1)
  c.num_turns = 3
  c.at_end = True  # run the held-out evaluation after the last step
  c.every = 2  # also before the first step and every N steps: Acc@k against cost (0: only at the end)
  c.temperature = 0.0  # greedy: the papers' Acc@k is one trajectory per problem
  c.samples = 1  # trajectories per problem (> 1 needs temperature > 0): Acc@k averages over them
  return c


def mesh() -> ml_collections.ConfigDict:
  """Learner sharding."""
  c = ml_collections.ConfigDict()
  c.enabled = False  # shard the learner over a ("data", "fsdp", "tensor") mesh
  c.data = 1
  c.fsdp = -1
  c.tensor = 1
  return c


def distributed() -> ml_collections.ConfigDict:
  """Multi-process JAX."""
  c = ml_collections.ConfigDict()
  c.enabled = False  # jax.distributed.initialize before anything else
  c.coordinator_address = ""
  c.num_processes = 1
  c.process_id = 0
  return c


def optim() -> ml_collections.ConfigDict:
  """The RL optimiser: `common.optim()` at this policy's learning rate."""
  c = common.optim()
  c.learning_rate = 5e-6
  return c


def learner() -> ml_collections.ConfigDict:
  """The RL objective: `common.learner()` without the compute of zero-advantage groups."""
  c = common.learner()
  c.drop_zero_advantage = True  # all-pass / all-fail groups add no gradient: skip their compute on CPU
  return c


def checkpoint() -> ml_collections.ConfigDict:
  """`common.checkpoint()` every 2 steps."""
  c = common.checkpoint()
  c.every = 2
  return c


def metrics() -> ml_collections.ConfigDict:
  """`common.metrics()` with an episode dump at every step."""
  c = common.metrics()
  c.episode_dump_every = 1
  c.episodes_per_dump = 8
  return c
