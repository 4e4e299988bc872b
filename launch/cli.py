"""The command line of the launch scripts: `--config <file> --config.<field>=<value> ...` (ml_collections
config_flags), turned once into the library's typed config (`to_typed`)."""
from __future__ import annotations

import importlib.util
import os
import pathlib
from typing import Callable, Mapping, Sequence, TypeVar

import ml_collections

from leap_jax.train.config import TrainConfig
from probe.config import PropelConfig

T = TypeVar("T")


def _config_path(argv: Sequence[str], flag: str) -> str | None:
  for i, arg in enumerate(argv):
    if arg == f"--{flag}" and i + 1 < len(argv):
      return argv[i + 1]
    if arg.startswith(f"--{flag}="):
      return arg.split("=", 1)[1]
  return None


def _unknown_override(argv: Sequence[str], flag: str) -> str | None:
  """The first `--<flag>.<path>=...` whose path is not a field of the config file's `get_config()`."""
  path = _config_path(argv, flag)
  if path is None or not os.path.isfile(path):
    return None
  spec = importlib.util.spec_from_file_location("_launch_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for arg in argv:
    if not arg.startswith(f"--{flag}."):
      continue
    field = arg[len(flag) + 3:].split("=", 1)[0]
    node = config
    for part in field.split("."):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        return field
      node = node[part]
  return None


def parse_config(argv: Sequence[str], flag_values=None, flag: str = "config") -> ml_collections.ConfigDict:
  """Parses `--config <file> --config.<field>=<value> ...`.

  Raises SystemExit with a message naming the field for an unknown field, and with absl's message for
  a value of the wrong type.
  """
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if flag not in flag_values:
    config_flags.DEFINE_config_file(flag, flag_values=flag_values, help_string="the run's config file",
                                    sys_argv=list(argv))
  try:
    flag_values(list(argv))
  except (AttributeError, KeyError) as e:
    field = _unknown_override(argv, flag)
    raise SystemExit(f"error: unknown config field {field!r}" if field else f"error: bad config override ({e})")
  except flags.Error as e:
    raise SystemExit(f"error: {e}")
  config = flag_values[flag].value
  if config is None:
    raise SystemExit(f"error: --{flag} <file> is required")
  enable_compile_cache(compile_cache_dir(os.environ))
  return config


def compile_cache_dir(environ: Mapping[str, str]) -> str:
  """Where JAX keeps compiled steps between runs: $JAX_COMPILATION_CACHE_DIR when set ("off" disables the cache),
  else <user cache>/leap_jax/jax ($XDG_CACHE_HOME, default ~/.cache), so that a rerun or a resumed run reads
  its compiled steps instead of compiling them again."""
  if "JAX_COMPILATION_CACHE_DIR" in environ:
    return environ["JAX_COMPILATION_CACHE_DIR"]
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "leap_jax", "jax")


def enable_compile_cache(directory: str) -> None:
  """Turns on JAX's persistent compilation cache in `directory` (created); "off" or "" leaves it off."""
  if directory in ("", "off"):
    return
  import jax  # pylint: disable=import-outside-toplevel
  pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)


def to_typed(config: ml_collections.ConfigDict, from_dict: Callable[[dict], T]) -> T:
  """`from_dict(config.to_dict())`, a bad value or a broken rule across fields as SystemExit naming them."""
  try:
    return from_dict(config.to_dict())
  except (ValueError, TypeError, FileNotFoundError) as e:
    raise SystemExit(f"error: config: {e}") from e


def train_config(argv: Sequence[str]) -> TrainConfig:
  """The typed LEAP run config of the command line."""
  return to_typed(parse_config(argv), TrainConfig.from_dict)


def propel_config(argv: Sequence[str]) -> PropelConfig:
  """The typed PROPEL config of the command line."""
  return to_typed(parse_config(argv), PropelConfig.from_dict)
