"""Configs: overrides and their errors, the typed config's checks, and dry runs of the GPU configs that allocate
nothing."""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest
from absl import flags

from configs import default, h200, learn_check, multihost, propel_cpu, propel_h200, smoke
from launch import cli
from leap_jax.rollout import methods
from leap_jax.train import build
from leap_jax.train.config import TrainConfig
from probe.config import PropelConfig


def _parse(*overrides, config="configs/smoke.py"):
  return cli.parse_config(["launch/train.py", "--config", config, *overrides], flag_values=flags.FlagValues())


def _typed(cfg):
  return TrainConfig.from_dict(cfg.to_dict())


def _propel(*overrides, config="configs/propel_cpu.py"):
  return PropelConfig.from_dict(_parse(*overrides, config=config).to_dict())


def test_overrides_apply():
  cfg = _parse("--config.rollout.group_size=3", "--config.method=grpo_mt")
  assert cfg.rollout.group_size == 3 and cfg.method == "grpo_mt"


def test_unknown_field_is_an_error_naming_it():
  with pytest.raises(SystemExit, match="unknown config field 'rollout.nope'"):
    _parse("--config.rollout.nope=1")
  with pytest.raises(SystemExit, match="unknown config field 'stepz'"):
    _parse("--config.stepz=1")


def test_bad_value_is_an_error_naming_the_flag():
  with pytest.raises(SystemExit, match="config.steps=abc"):
    _parse("--config.steps=abc")


def test_every_config_names_a_known_method_and_default_is_leap():
  for module in (default, smoke, h200, multihost, learn_check):
    assert module.get_config().method in methods.METHODS
  assert default.get_config().method == "leap"


def _live_bytes():
  return sum(a.nbytes for a in jax.live_arrays())


@pytest.mark.parametrize("module, mesh", [(h200, {"data": 1, "fsdp": 8, "tensor": 1}),
                                          (multihost, {"data": 8, "fsdp": 1, "tensor": 1})])
def test_gpu_configs_dry_run_without_allocating(module, mesh):
  cfg = module.get_config()
  before = _live_bytes()
  summary = build.dry_run(_typed(cfg))
  assert _live_bytes() - before < 1 << 20  # a 1.5B-parameter train state would be ~18 GB
  assert summary["mesh"] == mesh
  assert 1.4e9 < summary["params"] < 1.7e9  # Qwen2.5-1.5B
  assert summary["state_bytes"] > 3 * 4 * summary["params"]  # fp32 params + two Adam moments
  rows, length = summary["batch"]
  assert rows % 8 == 0 and rows >= cfg.rollout.num_problems * cfg.rollout.group_size
  assert length == cfg.rollout.max_context_len
  assert summary["tasks"] > 0
  assert multihost.get_config().distributed.enabled and not h200.get_config().distributed.enabled


def test_default_config_dry_run_matches_the_embedded_model():
  summary = build.dry_run(_typed(default.get_config()))
  assert 1.3e8 < summary["params"] < 1.4e8  # SmolLM2-135M
  assert summary["mesh"] is None


def test_every_config_becomes_a_typed_config():
  for module in (default, smoke, h200, multihost, learn_check):
    assert isinstance(_typed(module.get_config()), TrainConfig)
  for module in (propel_cpu, propel_h200):
    assert isinstance(PropelConfig.from_dict(module.get_config().to_dict()), PropelConfig)


def test_sentinels_are_resolved_once():
  config = _typed(default.get_config())
  assert (config.dcp.t_min, config.dcp.t_max) == (2, 3)  # G = 4: t_min = -1 -> G/2, t_max = -2 -> G - 1
  assert config.sft.checkpoint_dir == "workdirs/default/sft" and config.evaluator.timeout_s is None
  assert config.learner.grad_accum_steps == config.optim.grad_accum_steps
  propel = _propel()
  assert propel.corpus.dir == "workdirs/propel_cpu/corpus"
  assert propel.rl.export_dir == "workdirs/propel_cpu/generated_tasks"


@pytest.mark.parametrize("field, value, message", [
    ("method", "ppo", "unknown method 'ppo'"),
    ("rollout.context", "everything", "rollout.context 'everything'"),
    ("rollout.max_new_tokens", 4096, r"rollout.max_new_tokens \(4096\) must be below rollout.max_context_len"),
    ("dcp.t_min", 3, r"dcp.t_min / dcp.t_max with rollout.group_size = 2"),
    ("dcp.t_max", 5, r"dcp.t_min / dcp.t_max resolve to 1 / 5 failures, outside 0..rollout.group_size = 2"),
    ("optim.decay_steps", 1, r"optim.decay_steps \(1\) must exceed optim.warmup_steps"),
    ("learner.aggregation", "sum", "learner aggregation 'sum'"),
    ("tasks.lang", "triton", "tasks.lang 'triton'"),
    ("evaluator.isolation", "none", "evaluator.isolation 'none'"),
    ("checkpoint.every", 0, "checkpoint.every and checkpoint.keep must be >= 1"),
    ("heldout.samples", 0, r"heldout.samples must be >= 1, .* got samples 0 at temperature 0.0"),
    ("heldout.samples", 4, r"and 1 at heldout.temperature = 0 \(greedy trajectories are identical\)"),
])
def test_typed_config_rejects_bad_values_naming_the_fields(field, value, message):
  cfg = smoke.get_config()
  section, _, name = field.rpartition(".")
  (cfg[section] if section else cfg)[name] = value
  if field == "optim.decay_steps":
    cfg.optim.warmup_steps = 2
  with pytest.raises(ValueError, match=message):
    _typed(cfg)


def test_cross_section_rules_and_unknown_fields():
  cfg = smoke.get_config()
  cfg.distributed.enabled, cfg.distributed.num_processes = True, 4
  with pytest.raises(ValueError, match=r"rollout.num_problems \(2\) must be a multiple of distributed.num_processes"):
    _typed(cfg)
  d = smoke.get_config().to_dict()
  d["rollout"]["nope"] = 1
  with pytest.raises(ValueError, match=r"unknown config field\(s\) \['rollout.nope'\]"):
    TrainConfig.from_dict(d)
  d = smoke.get_config().to_dict()
  d["steps"] = "4"
  with pytest.raises(TypeError, match="config field 'steps' must be an int"):
    TrainConfig.from_dict(d)
  with pytest.raises(SystemExit, match="error: config: .*rollout.max_new_tokens"):
    cli.to_typed(_parse("--config.rollout.max_new_tokens=5000"), TrainConfig.from_dict)


def test_dry_run_rejects_unknown_task_ids():
  cfg = smoke.get_config()
  cfg.tasks.ids = ("no_such_task",)
  with pytest.raises(ValueError, match="no_such_task"):
    build.dry_run(_typed(cfg))


def test_propel_configs_name_generator_levels_and_solver(tmp_path):
  from probe import pipeline  # pylint: disable=import-outside-toplevel
  cpu = _propel("--config.generator.sft.steps=3")
  gpu = _propel(f"--config.generator.model.base={tmp_path}", config="configs/propel_h200.py")
  assert cpu.generator.levels == (0,) and gpu.generator.levels == (1, 2, 3)
  assert cpu.corpus.band == (1, 7) and gpu.corpus.band == (1, 3)
  assert cpu.solver.model.base == "workdirs/default/policy" and gpu.solver.model.base == "workdirs/h200/policy"
  assert pipeline.generator_id(cpu.generator, cpu.seed).startswith(
      "smollm2-135m-instruct+sft(levels=[0],shots=2,steps=3,")
  assert pipeline.generator_id(gpu.generator, gpu.seed) == gpu.generator.model.base  # no cold start at paper scale
  solver = dataclasses.replace(cpu.solver, model=dataclasses.replace(cpu.solver.model, base="no/such/folder"))
  with pytest.raises(FileNotFoundError, match="solver.model.base 'no/such/folder' does not exist"):
    pipeline.make_solver(solver, None, cpu.lang, cpu.seed)


def test_propel_h200_requires_a_generator_folder(tmp_path):
  from probe import pipeline  # pylint: disable=import-outside-toplevel
  gpu = _propel(f"--config.workdir={tmp_path}", config="configs/propel_h200.py")
  for needs_generator in (lambda: pipeline.generator_id(gpu.generator, gpu.seed),
                          lambda: pipeline.load_generator(gpu.generator, gpu.workdir, gpu.seed)):
    with pytest.raises(ValueError, match=r"generator.model.base is not set.*--config.generator.model.base="):
      needs_generator()
  gpu = _propel(f"--config.workdir={tmp_path}", "--config.generator.model.base=no/such/folder",
                config="configs/propel_h200.py")
  with pytest.raises(FileNotFoundError, match="generator.model.base 'no/such/folder' does not exist"):
    pipeline.load_generator(gpu.generator, gpu.workdir, gpu.seed)


def test_generator_sft_folder_must_hold_this_configs_generator(tmp_path):
  from probe import pipeline  # pylint: disable=import-outside-toplevel
  cfg = _propel(f"--config.workdir={tmp_path}")
  folder = pipeline.generator_sft_dir(cfg.workdir)
  folder.mkdir()
  (folder / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="holds the generator None, but this config's generator is"):
    pipeline.load_generator(cfg.generator, cfg.workdir, cfg.seed)
  other = _propel(f"--config.workdir={tmp_path}", "--config.generator.num_shots=1")
  (folder / pipeline.SFT_RECORD).write_text(json.dumps({"generator": pipeline.generator_id(other.generator, 0)}))
  with pytest.raises(ValueError, match=r"shots=1.*but this config's generator is .*shots=2.*remove the folder"):
    pipeline.load_generator(cfg.generator, cfg.workdir, cfg.seed)


def test_compile_cache_dir_follows_the_environment(tmp_path):
  assert cli.compile_cache_dir({"JAX_COMPILATION_CACHE_DIR": "off"}) == "off"
  assert cli.compile_cache_dir({"JAX_COMPILATION_CACHE_DIR": str(tmp_path)}) == str(tmp_path)
  assert cli.compile_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "leap_jax" / "jax")
  assert cli.compile_cache_dir({}).endswith(str(pathlib.Path(".cache", "leap_jax", "jax")))


_CACHE_PROBE = """
import sys
import jax
from launch import cli
cli.enable_compile_cache(sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None)
jax.jit(lambda x: (x @ x.T).sum() * 3)(jax.numpy.ones((16, 16))).block_until_ready()
print(len(hits))
"""


def test_compile_cache_lets_a_second_run_skip_compiling(tmp_path):
  """Two fresh processes with the launch commands' cache: the first compiles and writes, the second reads."""
  cache = tmp_path / "cache"
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
  env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parents[1])

  def run() -> str:
    return subprocess.run([sys.executable, "-c", _CACHE_PROBE, str(cache)], env=env, check=True,
                          capture_output=True, text=True).stdout.split()[-1]

  assert run() == "0" and any(cache.iterdir()), "the first run wrote nothing to the cache"
  assert int(run()) >= 1, "the second run compiled again instead of reading the cache"
