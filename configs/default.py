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

  c.model = ml_collections.ConfigDict()
  c.model.base = "smollm2-135m-instruct"  # embedded model name, HF checkpoint folder, .gguf file, or "random"
  c.model.arch = dict(SMOLLM2_135M)  # HF config.json dict: random init and dry runs without a checkpoint
  c.model.tokenizer = "smollm2-135m-instruct"  # tokenizer source when base = "random" (name or folder)
  c.model.dtype = "float32"
  c.model.param_dtype = "float32"
  c.model.scan_layers = True
  c.model.remat = "full"  # recompute layer activations in the backward pass (needed on CPU memory)

  c.tasks = ml_collections.ConfigDict()
  c.tasks.lang = "pallas"  # pallas | cuda
  c.tasks.levels = (0, 1)
  c.tasks.split = "train"
  c.tasks.ids = ()  # restrict to these task ids (empty: all of the levels and split)
  c.tasks.folder = ""  # a task folder instead of the embedded suite (e.g. tasks exported by train_generator.py)

  c.rollout = ml_collections.ConfigDict()
  c.rollout.num_problems = 2  # P tasks per step
  c.rollout.group_size = 4  # G episodes per task
  c.rollout.num_turns = 3  # T
  c.rollout.max_new_tokens = 128  # level-0 answers are ~20 tokens; level-1 sources (340+) are beyond this policy
  c.rollout.max_context_len = 3072  # KV-cache slots per episode (all turns)
  c.rollout.context = "episode"  # episode (whole conversation) | latest (statement + latest code + feedback)
  c.rollout.truncated_as = "failure"  # failure | invalid
  c.rollout.eval_retries = 2  # retries of evaluator infrastructure errors before a trajectory is invalid
  c.rollout.temperature = 1.3  # at 0.8-1.0 the SFT policy answers most level-0 tasks identically in a group
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.overlap = "auto"  # auto: evaluation overlaps generation only with more than 2 cores | on | off

  c.dcp = ml_collections.ConfigDict()
  c.dcp.t_min = -1  # -1: G/2 (rounded up)
  c.dcp.t_max = -2  # G - 1: all-fail groups (level-1 tasks are beyond a 135M policy) get no turns 2..T; -1: G

  c.evaluator = ml_collections.ConfigDict()
  c.evaluator.workers = 2  # single-threaded sandboxed worker processes
  c.evaluator.timeout_s = 0.0  # per-job wall limit; 0 = the backend's default
  c.evaluator.isolation = "namespaces"  # "process": opt out of kernel-level isolation (machines without namespaces)

  c.sft = ml_collections.ConfigDict()
  c.sft.enabled = True  # RL starts from the cold-start SFT checkpoint, trained first when missing
  c.sft.checkpoint_dir = ""  # HF folder of the SFT model; "" = <workdir>/sft
  c.sft.levels = (0,)  # train-split tasks of these levels ...
  c.sft.extra_ids = ("row_mean", "transpose")  # ... plus these (a few level-1 tasks) ...
  c.sft.exclude_ids = ("clamp", "scale", "sigmoid")  # ... minus these: pool tasks the policy must generalise to
  c.sft.steps = 6
  c.sft.batch_size = 2
  c.sft.prompt_grad = False  # False: truncated gradient, prompt prefilled without gradient (see train/sft.py)
  c.sft.optim = common.optim()
  c.sft.optim.learning_rate = 1e-4
  c.sft.optim.warmup_steps = 1

  c.precheck = ml_collections.ConfigDict()
  c.precheck.enabled = True  # measure the turn-1 pass rate on the task pool before RL
  c.precheck.samples_per_task = 1
  c.precheck.after = True  # measure it again after the last step (same tasks and sampling keys)

  c.heldout = ml_collections.ConfigDict()
  c.heldout.split = "eval"  # held-out tasks for launch/eval.py and the end of training
  c.heldout.levels = (0, 1)
  c.heldout.num_turns = 3
  c.heldout.at_end = True  # run the held-out evaluation after the last step
  c.heldout.every = 2  # also before the first step and every N steps: Acc@k against cost (0: only at the end)
  c.heldout.temperature = 0.0  # greedy: the papers' Acc@k is one trajectory per problem

  c.mesh = ml_collections.ConfigDict()
  c.mesh.enabled = False  # shard the learner over a ("data", "fsdp", "tensor") mesh
  c.mesh.data = 1
  c.mesh.fsdp = -1
  c.mesh.tensor = 1

  c.distributed = ml_collections.ConfigDict()
  c.distributed.enabled = False  # jax.distributed.initialize before anything else
  c.distributed.coordinator_address = ""
  c.distributed.num_processes = 1
  c.distributed.process_id = 0

  c.optim = common.optim()
  c.optim.learning_rate = 5e-6
  c.learner = common.learner()
  c.learner.drop_zero_advantage = True  # all-pass / all-fail groups add no gradient: skip their compute on CPU
  c.checkpoint = common.checkpoint()
  c.checkpoint.every = 2
  c.metrics = common.metrics()
  c.metrics.episode_dump_every = 1
  c.metrics.episodes_per_dump = 8
  return c
