"""Diversity of generated tasks (Self-BLEU, distinct-3) and its place in the generator audit."""
import collections
import math
import types

import numpy as np
import pytest

from probe import diversity
from probe import generator_rl


def test_self_bleu_and_distinct_3_against_hand_values():
  # "a b c d" against "a b c e": p1..p4 = 3/4, 2/3, 1/2, 0 -> 0.1 (smoothed), equal lengths (BP = 1).
  assert diversity.self_bleu(["a b c d", "a b c e"]) == pytest.approx((0.75 * 2 / 3 * 0.5 * 0.1) ** 0.25)
  assert diversity.self_bleu(["x = f(a, b)"] * 3) == pytest.approx(1.0)
  assert diversity.distinct_n(["a b c d", "a b c e"], 3) == pytest.approx(3 / 4)  # abc, bcd, abc, bce
  assert diversity.distinct_n(["same text here"] * 4, 3) == pytest.approx(1 / 4)
  assert math.isnan(diversity.self_bleu(["only one"])) and math.isnan(diversity.distinct_n(["a b"], 3))
  assert diversity.tokens("y = x[0]+1") == ["y", "=", "x", "[", "0", "]", "+", "1"]


def _bleu_brute_force(texts, i, max_n=4):
  words = [diversity.tokens(t) for t in texts]
  others = [w for j, w in enumerate(words) if j != i]
  log_p = 0.0
  for n in range(1, max_n + 1):
    hyp = diversity.ngrams(words[i], n)
    ref_max = collections.Counter()
    for w in others:
      ref_max |= diversity.ngrams(w, n)  # elementwise max
    matched = sum(min(k, ref_max[g]) for g, k in hyp.items())
    log_p += math.log((matched or 0.1) / sum(hyp.values()))
  r = min((len(w) for w in others), key=lambda x: (abs(x - len(words[i])), x))
  bp = 1.0 if len(words[i]) > r else math.exp(1 - r / len(words[i]))
  return bp * math.exp(log_p / max_n)


def test_self_bleu_clips_by_the_largest_count_among_the_other_texts():
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(list("abcd"), size=rng.integers(5, 12))) for _ in range(6)]
  want = np.mean([_bleu_brute_force(texts, i) for i in range(len(texts))])
  assert diversity.self_bleu(texts) == pytest.approx(want)


class _Chat:
  def decode(self, tokens, skip_special_tokens=True):
    return tokens


def test_audit_reports_diversity_of_the_valid_generated_tasks():
  replies = ["def reference(x): return x + 1", "def reference(x): return x + 1", "garbage", "def reference(y): y * 2"]
  source = types.SimpleNamespace(chat=_Chat(), sample=lambda params, seeds: (None, [
      types.SimpleNamespace(tokens=replies[s]) for s in seeds]))
  checker = types.SimpleNamespace(check=lambda text: types.SimpleNamespace(
      text=text, valid="reference" in text, reason="", family="elementwise", norm_hash=text, task=text))
  solver = types.SimpleNamespace(attempts=lambda task, seed, index: [True, False])
  metrics, records = generator_rl.audit(source, None, checker, solver, [0, 1, 2, 3], band=(1, 1))
  valid = [r.text for r in records if r.valid]
  assert len(valid) == 3 and metrics["audit/validity"] == pytest.approx(0.75)
  assert metrics["audit/self_bleu"] == pytest.approx(diversity.self_bleu(valid))
  assert metrics["audit/distinct_3"] == pytest.approx(diversity.distinct_n(valid, 3))
  assert 0 < metrics["audit/distinct_3"] < 1 and 0 < metrics["audit/self_bleu"] < 1
