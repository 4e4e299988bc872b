"""Configs: overrides and their errors, and dry runs of the GPU configs that allocate nothing."""
import json

import jax
import pytest
from absl import flags

from configs import default, h200, multihost, smoke
from leap_jax.rollout import methods
from leap_jax.train import loop


def _parse(*overrides, config="configs/smoke.py"):
  return loop.parse_config(["launch/train.py", "--config", config, *overrides], flag_values=flags.FlagValues())


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
  for module in (default, smoke, h200, multihost):
    assert module.get_config().method in methods.METHODS
  assert default.get_config().method == "leap"


def _live_bytes():
  return sum(a.nbytes for a in jax.live_arrays())


@pytest.mark.parametrize("module, mesh", [(h200, {"data": 1, "fsdp": 8, "tensor": 1}),
                                          (multihost, {"data": 8, "fsdp": 1, "tensor": 1})])
def test_gpu_configs_dry_run_without_allocating(module, mesh):
  cfg = module.get_config()
  before = _live_bytes()
  summary = loop.dry_run(cfg)
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
  summary = loop.dry_run(default.get_config())
  assert 1.3e8 < summary["params"] < 1.4e8  # SmolLM2-135M
  assert summary["mesh"] is None


def test_dry_run_rejects_bad_values():
  cfg = smoke.get_config()
  cfg.method = "ppo"
  with pytest.raises(ValueError, match="unknown method 'ppo'"):
    loop.dry_run(cfg)
  cfg = smoke.get_config()
  cfg.rollout.context = "everything"
  with pytest.raises(ValueError, match="rollout.context 'everything'"):
    loop.dry_run(cfg)
  cfg = smoke.get_config()
  cfg.tasks.ids = ("no_such_task",)
  with pytest.raises(ValueError, match="no_such_task"):
    loop.dry_run(cfg)


def test_propel_configs_name_generator_levels_and_solver(tmp_path):
  from probe import pipeline  # pylint: disable=import-outside-toplevel
  cpu = _parse("--config.generator.sft.steps=3", config="configs/propel_cpu.py")
  gpu = _parse(f"--config.generator.model.base={tmp_path}", config="configs/propel_h200.py")
  assert tuple(cpu.generator.levels) == (0,) and tuple(gpu.generator.levels) == (1, 2, 3)
  assert tuple(cpu.corpus.band) == (1, 7) and tuple(gpu.corpus.band) == (1, 3)
  assert cpu.solver.model.base == "workdirs/default/policy" and gpu.solver.model.base == "workdirs/h200/policy"
  assert pipeline.generator_id(cpu).startswith("smollm2-135m-instruct+sft(levels=[0],shots=2,steps=3,")
  assert pipeline.generator_id(gpu) == gpu.generator.model.base  # no cold start at paper scale
  cpu.solver.model.base = "no/such/folder"
  with pytest.raises(FileNotFoundError, match="solver.model.base 'no/such/folder' does not exist"):
    pipeline.make_solver(cpu, evaluator=None)


def test_propel_h200_requires_a_generator_folder(tmp_path):
  from probe import pipeline  # pylint: disable=import-outside-toplevel
  gpu = _parse(f"--config.workdir={tmp_path}", config="configs/propel_h200.py")
  for needs_generator in (pipeline.generator_id, pipeline.load_generator):
    with pytest.raises(ValueError, match=r"generator.model.base is not set.*--config.generator.model.base="):
      needs_generator(gpu)
  gpu = _parse(f"--config.workdir={tmp_path}", "--config.generator.model.base=no/such/folder",
               config="configs/propel_h200.py")
  with pytest.raises(FileNotFoundError, match="generator.model.base 'no/such/folder' does not exist"):
    pipeline.load_generator(gpu)


def test_generator_sft_folder_must_hold_this_configs_generator(tmp_path):
  from probe import pipeline  # pylint: disable=import-outside-toplevel
  cfg = _parse(f"--config.workdir={tmp_path}", config="configs/propel_cpu.py")
  folder = pipeline.generator_sft_dir(cfg)
  folder.mkdir()
  (folder / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="holds the generator None, but this config's generator is"):
    pipeline.load_generator(cfg)
  other = _parse(f"--config.workdir={tmp_path}", "--config.generator.num_shots=1", config="configs/propel_cpu.py")
  (folder / pipeline.SFT_RECORD).write_text(json.dumps({"generator": pipeline.generator_id(other)}))
  with pytest.raises(ValueError, match=r"shots=1.*but this config's generator is .*shots=2.*remove the folder"):
    pipeline.load_generator(cfg)
