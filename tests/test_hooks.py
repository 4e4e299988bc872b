"""Hooks run on their own schedules in the order they were added, and the loop stops its evaluator's workers on
every exit path."""
import pytest

from configs import smoke
from leap_jax.train import build
from leap_jax.train import hooks as hooks_lib
from leap_jax.train import loop
from leap_jax.train.config import TrainConfig


def _run(hooks, steps, stop_after=None):
  for step in range(1, steps + 1):
    info = hooks_lib.StepInfo(step, state=None, metrics={"loss": float(step)}, final=step == steps,
                              stop_requested=lambda: step == stop_after)
    hooks.run(info)
    if info.last:
      return


def test_schedules_offsets_and_the_last_step():
  calls = []
  hooks = hooks_lib.Hooks()
  hooks.add("every", lambda info: calls.append(("every", info.step)))
  hooks.add("third", lambda info: calls.append(("third", info.step)), every=3, at_last=True)
  hooks.add("first_of_three", lambda info: calls.append(("first_of_three", info.step)), every=3, offset=1)
  hooks.add("never", lambda info: calls.append(("never", info.step)), every=0)
  _run(hooks, 7)
  assert [s for n, s in calls if n == "every"] == [1, 2, 3, 4, 5, 6, 7]
  assert [s for n, s in calls if n == "third"] == [3, 6, 7]  # and the last step
  assert [s for n, s in calls if n == "first_of_three"] == [1, 4, 7]
  assert not [s for n, s in calls if n == "never"]
  assert hooks.names == ["every", "third", "first_of_three", "never"]
  calls.clear()
  hooks.run(hooks_lib.StepInfo(0, None, {}), names=("never",))  # run now, whatever the schedule
  assert calls == [("never", 0)]


def test_a_stop_is_the_last_step_and_later_hooks_see_earlier_metrics():
  seen = []
  hooks = hooks_lib.Hooks()
  hooks.add("adds", lambda info: info.metrics.update({"heldout/Acc@1": 0.5}), every=2, at_last=True)
  hooks.add("reads", lambda info: seen.append((info.step, dict(info.metrics))))
  _run(hooks, 10, stop_after=3)
  assert seen == [(1, {"loss": 1.0}), (2, {"loss": 2.0, "heldout/Acc@1": 0.5}), (3, {"loss": 3.0, "heldout/Acc@1": 0.5})]
  with pytest.raises(ValueError, match="every must be >= 0"):
    hooks.add("bad", print, every=-1)


class _Evaluator:
  closed = False

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.closed = True

  def evaluate_many(self, requests):
    raise AssertionError("not reached")


def test_train_closes_its_evaluator_when_building_the_run_fails(tmp_path, monkeypatch):
  made = []
  monkeypatch.setattr(build, "make_evaluator", lambda config: made.append(_Evaluator()) or made[-1])
  cfg = smoke.get_config()
  cfg.workdir = str(tmp_path)
  cfg.model.base = str(tmp_path / "no_such_checkpoint")
  with pytest.raises(FileNotFoundError, match="no_such_checkpoint"):
    loop.train(TrainConfig.from_dict(cfg.to_dict()), echo=lambda s: None)
  assert len(made) == 1 and made[0].closed
