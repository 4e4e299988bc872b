"""Diversity of a set of generated task files: Self-BLEU and distinct-n.

Texts are split into tokens w = words and single punctuation characters (`tokens`). For M texts:

  Self-BLEU = mean_i BLEU-4(text_i; references = the other M - 1 texts)            (Zhu et al. 2018, Texygen)
  BLEU-4    = BP * exp(mean_{n=1..4} log p_n),
  p_n       = sum_g min(c_i(g), max_{j != i} c_j(g)) / sum_g c_i(g) over the n-grams g of text i
              (a zero numerator becomes 0.1: NLTK's smoothing method1, as Texygen uses),
  BP        = 1 if c > r else exp(1 - r / c), c = len(text_i), r = the closest reference length (shorter on ties);
  distinct-n = #unique n-grams / #n-grams over all texts                               (Li et al. 2016).

Higher Self-BLEU and lower distinct-n mean less diverse (a generator collapsing onto one kind of task).
"""
from __future__ import annotations

import collections
import math
import re
from typing import Sequence

_TOKEN = re.compile(r"\w+|[^\w\s]")
_EPSILON = 0.1  # smoothing of a zero n-gram match count (NLTK method1)


def tokens(text: str) -> list[str]:
  return _TOKEN.findall(text)


def ngrams(words: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(words[k:k + n]) for k in range(len(words) - n + 1))


def distinct_n(texts: Sequence[str], n: int = 3) -> float:
  """#unique n-grams / #n-grams over all texts; NaN when the texts hold no n-gram."""
  counts = collections.Counter()
  for t in texts:
    counts.update(ngrams(tokens(t), n))
  total = sum(counts.values())
  return len(counts) / total if total else float("nan")


def _max_over_others(counters: Sequence[collections.Counter]) -> list[dict]:
  """For each text i, g -> max_{j != i} c_j(g) over the n-grams g of text i (from each n-gram's top two counts)."""
  top: dict = {}  # g -> (largest count, its text, second largest count)
  for i, c in enumerate(counters):
    for g, k in c.items():
      c1, i1, c2 = top.get(g, (0, -1, 0))
      top[g] = (k, i, c1) if k > c1 else (c1, i1, max(c2, k))
  return [{g: (top[g][2] if top[g][1] == i else top[g][0]) for g in c} for i, c in enumerate(counters)]


def _brevity_penalty(length: int, ref_lengths: Sequence[int]) -> float:
  r = min(ref_lengths, key=lambda x: (abs(x - length), x))
  return 1.0 if length > r else math.exp(1.0 - r / length)


def self_bleu(texts: Sequence[str], max_n: int = 4) -> float:
  """Mean BLEU-`max_n` of each text against all the others (module docstring); NaN for fewer than 2 texts."""
  if len(texts) < 2:
    return float("nan")
  words = [tokens(t) for t in texts]
  per_n = [(c, _max_over_others(c)) for c in ([ngrams(w, n) for w in words] for n in range(1, max_n + 1))]
  lengths = [len(w) for w in words]
  scores = []
  for i, w in enumerate(words):
    if len(w) < max_n:
      scores.append(0.0)
      continue
    log_p = 0.0
    for counters, others in per_n:
      matched = sum(min(k, others[i][g]) for g, k in counters[i].items())
      log_p += math.log((matched or _EPSILON) / sum(counters[i].values()))
    scores.append(_brevity_penalty(len(w), lengths[:i] + lengths[i + 1:]) * math.exp(log_p / max_n))
  return sum(scores) / len(scores)
