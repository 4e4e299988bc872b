"""Method table, keep rules and credit assignment; task-pool order and resumption."""
import numpy as np
import pytest

from leap_jax.rollout import methods
from leap_jax.rollout.task_pool import TaskPool

BUILTIN = ("leap", "leap_no_dcp", "grpo", "grpo_mt", "kevin", "trloo")


def _outcomes(first_pass, num_turns):
  """success[P,G,T] and keep[P,G,T] for samples that stop at their first pass (0 = never passes)."""
  first_pass = np.asarray(first_pass)
  turns = np.arange(1, num_turns + 1)
  success = (first_pass[..., None] == turns)
  stop = np.where(first_pass == 0, num_turns, first_pass)
  keep = turns <= stop[..., None]
  return success, keep


def test_leap_credit_matches_paper_example():
  # G=8, first-pass turns [1, 2, F x 6] -> rank rewards [1, 5/7, -2/7 x 6].
  success, keep = _outcomes([[1, 2, 0, 0, 0, 0, 0, 0]], 3)
  valid = np.ones((1, 8), bool)
  out = methods.credit(methods.get_method("leap"), success, keep, valid, np.full(success.shape, np.nan))
  np.testing.assert_allclose(out.reward[0], [1, 5 / 7] + [-2 / 7] * 6, atol=1e-6)
  # gamma = 1: the turn-2 solver's positive credit reaches its turn 1 undiscounted.
  np.testing.assert_allclose(out.advantages[0, 1], [5 / 7, 5 / 7, 0], atol=1e-6)
  np.testing.assert_allclose(out.advantages[0, 2], [-2 / 7] * 3, atol=1e-6)
  np.testing.assert_array_equal(out.level[0], [1, 2] + [4] * 6)


def test_grpo_mt_broadcasts_group_advantage_to_kept_turns():
  success, keep = _outcomes([[1, 3, 0, 0]], 3)
  out = methods.credit(methods.get_method("grpo_mt"), success, keep, np.ones((1, 4), bool),
                       np.full(success.shape, np.nan))
  np.testing.assert_array_equal(out.reward[0], [1, 1, 0, 0])
  a = out.advantages[0]
  assert a[0, 0] > 0 and a[0, 1] == 0  # solved at turn 1: one kept turn
  np.testing.assert_allclose(a[1], [a[1, 0]] * 3)  # same value on every kept turn
  assert a[2, 0] < 0 and np.allclose(a[2], a[3])


def test_kevin_without_timings_is_correctness_only_and_normalised_per_task():
  success = np.zeros((1, 2, 2), bool)
  success[0, 0, 1] = True
  keep = np.ones_like(success)
  m = methods.get_method("kevin")
  scores = methods.turn_scores(m, success, np.full(success.shape, np.nan))
  np.testing.assert_allclose(scores[0], [[0, 0.3], [0, 0]])
  out = methods.credit(m, success, keep, np.ones((1, 2), bool), np.full(success.shape, np.nan))
  # returns [[0.12, 0.3], [0, 0]] normalised over the 4 turn samples of the task.
  r = np.array([0.12, 0.3, 0, 0])
  np.testing.assert_allclose(out.advantages[0].ravel(), (r - r.mean()) / (r.std(ddof=1) + 1e-6), atol=1e-5)
  timed = methods.turn_scores(m, success, np.full(success.shape, 2.0, np.float32))
  np.testing.assert_allclose(timed[0, 0, 1], 2.3)


def test_trloo_caps_speedup_and_uses_leave_one_out_per_turn():
  success = np.array([[[True], [False]]])
  keep = np.ones_like(success)
  m = methods.get_method("trloo")
  out = methods.credit(m, success, keep, np.ones((1, 2), bool), np.full(success.shape, 10.0, np.float32))
  np.testing.assert_allclose(out.advantages[0, :, 0], [2.0, -2.0])


def test_trloo_score_is_half_correctness_plus_half_capped_speedup():
  """Dr. Kernel's score 0.5*1[correct] + 0.5*min(speedup, 3): timed at 2x, capped at 3x, untimed, failed."""
  success = np.array([[[True], [True], [True], [False]]])
  speedup = np.array([[[2.0], [10.0], [np.nan], [2.0]]], np.float32)
  scores = methods.turn_scores(methods.get_method("trloo"), success, speedup)
  np.testing.assert_allclose(scores[0, :, 0], [1.5, 2.0, 0.5, 0.0])


def test_kevin_caps_speedup_and_a_suspicious_speedup_scores_nothing():
  from kernels_eval import schema  # pylint: disable=import-outside-toplevel
  from leap_jax.rollout import harness  # pylint: disable=import-outside-toplevel
  success = np.ones((1, 3, 1), bool)
  scores = methods.turn_scores(methods.get_method("kevin"), success, np.array([[[50.0], [2.0], [np.nan]]], np.float32))
  np.testing.assert_allclose(scores[0, :, 0], [0.3 + methods.KEVIN_SPEEDUP_CAP, 2.3, 0.3])
  timed = schema.Timing(kernel_ms=0.01, reference_ms=10.0, speedup=1000.0)
  speedup = np.full((1, 1, 2), np.nan, np.float32)
  for t, flags in enumerate(([], ["suspicious_speedup"])):
    result = schema.EvalResult(status="correct", stage="timing", timing=timed, flags=flags)
    holder = type("Batch", (), {"results": {}, "success": np.zeros((1, 1, 2), bool),
                                "status": np.zeros((1, 1, 2), np.int32), "speedup": speedup})()
    harness.Rollout._store(holder, 0, 0, t, result)  # pylint: disable=protected-access
  assert speedup[0, 0, 0] == 1000.0 and np.isnan(speedup[0, 0, 1])


def test_invalid_samples_get_no_credit_and_are_not_counted():
  success, keep = _outcomes([[1, 0, 0, 1]], 2)
  valid = np.array([[True, True, True, False]])
  out = methods.credit(methods.get_method("leap"), success, keep, valid, np.full(success.shape, np.nan))
  assert np.all(out.advantages[0, 3] == 0)
  np.testing.assert_allclose(out.reward[0, :3], [1, -0.5, -0.5])


def test_keep_rules():
  valid = np.ones((2, 4), bool)
  first = np.array([[True, True, True, False], [True, False, False, False]])
  leap = methods.get_method("leap")
  active = methods.group_active(leap, first, valid, *methods.dcp_thresholds(4, None, None))
  np.testing.assert_array_equal(active, [False, True])  # 1 failure < t_min = 2; 3 failures expand
  np.testing.assert_array_equal(methods.next_turn(leap, first, active, valid),
                                [[False] * 4, [False, True, True, True]])
  no_dcp = methods.get_method("leap_no_dcp")
  all_groups = methods.group_active(no_dcp, first, valid, 0, 4)
  np.testing.assert_array_equal(methods.next_turn(no_dcp, first, all_groups, valid), ~first)
  kevin = methods.get_method("kevin")
  np.testing.assert_array_equal(methods.next_turn(kevin, first, all_groups, valid), valid)
  grpo = methods.get_method("grpo")
  assert methods.max_turns(grpo, 3) == 1 and methods.max_turns(leap, 3) == 3
  assert not methods.group_active(grpo, first, valid, 0, 4).any()
  assert not methods.next_turn(grpo, first, all_groups, valid).any()
  assert [name for name in BUILTIN if methods.get_method(name).uses_dcp] == ["leap"]
  assert [name for name in BUILTIN if methods.get_method(name).timed_score] == ["kevin", "trloo"]
  with pytest.raises(ValueError, match="'leap' has no per-turn score"):
    methods.turn_scores(leap, first[..., None], np.ones((2, 4, 1), np.float32))


def test_bad_names_and_thresholds_raise():
  with pytest.raises(ValueError, match="unknown method 'ppo'") as error:
    methods.get_method("ppo")
  assert all(repr(name) in str(error.value) for name in BUILTIN)
  with pytest.raises(ValueError, match="t_min=5 > t_max=4"):
    methods.dcp_thresholds(4, 5, -1)
  assert methods.dcp_thresholds(8, -1, -1) == (4, 8)
  assert methods.dcp_thresholds(5, None, 4) == (3, 4)
  assert methods.dcp_thresholds(8, -1, -2) == (4, 7) and methods.dcp_thresholds(8, 2, -3) == (2, 6)


def test_table_lists_every_method():
  table = methods.table_markdown()
  for name in methods.METHODS:
    assert f"| `{name}` |" in table


def test_table_is_generated_from_the_registry():
  lines = methods.table_markdown().splitlines()
  cells = [line.split(" | ") for line in lines]
  assert lines[0] == ("| method | keep rule (who gets turn t+1) | per-turn score | gamma | advantage | "
                      "[P,G] -> [P,G,T] |")
  assert lines[1] == "|---|---|---|---|---|---|"
  assert [row[0] for row in cells[2:]] == [f"| `{name}`" for name in BUILTIN]  # one row each, in order
  assert all(len(cells[i]) == 6 and lines[i].endswith(" |") for i in [0, *range(2, len(lines))])
  leap = methods.get_method("leap")
  assert lines[2] == "| " + " | ".join(("`leap`", leap.keep.text, *leap.row)) + " |"
  assert cells[2][3] == "1.0" and cells[4][3] == "-" and cells[6][3] == "0.4"  # gamma of leap, grpo, kevin
  assert cells[3][1] == cells[5][1] == cells[7][1] == methods.UNTIL_SOLVED.text  # a shared keep rule


@pytest.fixture(name="registry")
def _registry(monkeypatch):
  """A copy of the registry that the test may add to; the real one is restored afterwards."""
  monkeypatch.setattr(methods, "METHODS", dict(methods.METHODS))
  return methods.METHODS


def test_a_name_registers_once(registry):
  with pytest.raises(ValueError, match="'leap' is already registered"):
    methods.register(methods.get_method("leap"))
  with pytest.raises(ValueError, match="'grpo' is already registered"):
    methods.register(methods.Method("grpo", methods.ALL_TURNS, methods.grpo_credit, methods.TableRow(*"abcd")))
  assert list(registry) == list(BUILTIN)


def test_a_registered_method_is_found_and_its_credit_used(registry):
  def signed_pass(success, keep, valid, speedup):
    del valid, speedup
    adv = np.where(keep, np.where(success, 1.0, -1.0), 0.0)
    return methods.Credit(adv.astype(np.float32), adv.sum(-1).astype(np.float32), np.zeros(keep.shape[:2], np.int32))

  toy = methods.register(methods.Method("toy", methods.UNTIL_SOLVED, signed_pass,
                                        methods.TableRow("1[correct]", "-", "+-1", "per turn")))
  assert methods.get_method("toy") is toy and "toy" in registry and not toy.uses_dcp and not toy.timed_score
  success, keep = _outcomes([[2, 0, 1]], 2)
  success[0, 2, 1] = True  # not kept: credit never sees it
  out = methods.credit(toy, success, keep, np.array([[True, True, False]]), np.full(success.shape, np.nan))
  np.testing.assert_array_equal(out.advantages[0], [[-1, 1], [-1, -1], [0, 0]])  # the invalid sample gets 0
  np.testing.assert_array_equal(out.reward[0], [0, -2, 0])
  assert methods.table_markdown().splitlines()[-1] == (
      f"| `toy` | {methods.UNTIL_SOLVED.text} | 1[correct] | - | +-1 | per turn |")


def test_a_registration_does_not_outlive_its_test():
  assert list(methods.METHODS) == list(BUILTIN)


def _rollout_keep(method, success, valid):
  """keep[P,G,T] that `method`'s keep rule grants for these outcomes (DCP with its default thresholds)."""
  num_turns = methods.max_turns(method, success.shape[-1])
  active = methods.group_active(method, success[..., 0], valid, *methods.dcp_thresholds(success.shape[1], None, None))
  keep = np.zeros_like(success)
  keep[..., 0] = valid
  solved = np.zeros_like(valid)
  for t in range(1, num_turns):
    solved |= keep[..., t - 1] & success[..., t - 1]
    keep[..., t] = methods.next_turn(method, solved, active, valid)
  return keep


# What sums to zero over a group: LEAP's rank reward, GRPO's turn-1 advantage over the valid samples, Kevin's
# normalised returns over all kept turn samples of the task, TRLOO's leave-one-out advantage per turn index.
ZERO_SUM = {
    "leap": lambda out: out.reward.sum(1),
    "leap_no_dcp": lambda out: out.reward.sum(1),
    "grpo": lambda out: out.advantages[..., 0].sum(1),
    "grpo_mt": lambda out: out.advantages[..., 0].sum(1),
    "kevin": lambda out: out.advantages.sum((1, 2)),
    "trloo": lambda out: out.advantages.sum(1),
}


@pytest.mark.parametrize("name", BUILTIN)
def test_credit_is_zero_sum_and_zero_where_not_kept(name):
  rng = np.random.default_rng(7)
  success = rng.random((6, 5, 3)) < 0.4
  valid = rng.random((6, 5)) < 0.8
  speedup = np.where(rng.random(success.shape) < 0.5, rng.uniform(0.5, 20, success.shape), np.nan).astype(np.float32)
  method = methods.get_method(name)
  keep = _rollout_keep(method, success, valid)
  out = methods.credit(method, success, keep, valid, speedup)
  assert out.advantages.shape == success.shape and out.advantages.dtype == np.float32
  assert np.all(out.advantages[~keep] == 0) and np.all(out.advantages[~valid] == 0)
  assert np.any(out.advantages != 0)
  np.testing.assert_allclose(ZERO_SUM[name](out), 0.0, atol=1e-4)


def test_task_pool_is_deterministic_and_resumable():
  pool = TaskPool(list(range(5)), seed=3)
  first = pool.draw(3) + pool.draw(4)
  assert sorted(first[:5]) == list(range(5))  # one epoch is a permutation
  state = pool.state_dict()
  later = pool.draw(6)
  restored = TaskPool(list(range(5)), seed=3)
  restored.load_state_dict(state)
  assert restored.draw(6) == later
  again = TaskPool(list(range(5)), seed=3)
  assert again.draw(7) == first
  assert TaskPool(list(range(50)), seed=4).draw(50) != TaskPool(list(range(50)), seed=3).draw(50)
  with pytest.raises(ValueError, match="does not match"):
    TaskPool(list(range(4)), seed=3).load_state_dict(state)
  with pytest.raises(ValueError, match="empty"):
    TaskPool([], seed=0)
