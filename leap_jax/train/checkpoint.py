"""Orbax checkpoints of the whole training state, with automatic resume from the workdir.

A checkpoint at train step n holds:
  state:   the TrainState pytree (params, optimizer state, RNG key, step), restored with its shardings;
  sampler: the task sampler's state, an opaque JSON-able dict given by the caller;
  config:  the resolved run config (JSON).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import orbax.checkpoint as ocp

ITEMS = ("state", "sampler", "config")


def _as_json(config: Any) -> dict:
  if not isinstance(config, Mapping):
    raise TypeError(f"checkpoint config must be a JSON-able mapping, got {type(config).__name__}")
  return dict(config)


class Checkpointer:
  """Saves every `every` steps into `<workdir>/checkpoints`, keeping the last `keep`.

  Usage:
    ckpt = Checkpointer(workdir, every=50, keep=3)
    restored = ckpt.restore_latest(learner.abstract_state(params, specs))
    state, sampler_state = (restored["state"], restored["sampler"]) if restored else (init..., {})
    ...
    ckpt.save(step, state, sampler_state, config)            # saves when step % every == 0
    ckpt.save(step, state, sampler_state, config, force=True)  # on SIGTERM and at the end
    ckpt.close()
  """

  def __init__(self, workdir: str | os.PathLike, *, every: int, keep: int, async_save: bool = True):
    if every < 1 or keep < 1:
      raise ValueError(f"checkpoint every and keep must be >= 1, got every={every} keep={keep}")
    self.every = every
    self.directory = os.path.join(os.path.abspath(os.fspath(workdir)), "checkpoints")
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=async_save),
        item_names=ITEMS)

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, sampler_state: dict, config: Any, *, force: bool = False) -> bool:
    """Saves when `step` is a multiple of `every` or `force`; returns whether a save was started."""
    if not force and step % self.every:
      return False
    if step == self.latest_step():
      return False
    return self.manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            sampler=ocp.args.JsonSave(sampler_state),
            config=ocp.args.JsonSave(_as_json(config))),
        force=True)

  def restore(self, step: int, abstract_state: Any) -> dict[str, Any]:
    """{"step", "state", "sampler", "config"} of checkpoint `step`; `abstract_state` gives shapes, dtypes
    and shardings (see `Learner.abstract_state`)."""
    restored = self.manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            sampler=ocp.args.JsonRestore(),
            config=ocp.args.JsonRestore()))
    return {"step": step, "state": restored.state, "sampler": restored.sampler, "config": restored.config}

  def restore_latest(self, abstract_state: Any) -> Optional[dict[str, Any]]:
    """The latest checkpoint (as `restore`), or None when the workdir has none."""
    step = self.latest_step()
    return None if step is None else self.restore(step, abstract_state)

  def wait(self) -> None:
    """Blocks until background saves are on disk."""
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
