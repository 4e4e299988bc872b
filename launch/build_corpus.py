"""Labelled PROPEL corpus: `python launch/build_corpus.py --config configs/propel_cpu.py [--config.<f>=<v> ...]`.

N generations of the frozen reference generator; each valid task gets K solver attempts and the label
y = 1[a <= passes <= b]. Records are written durably as they finish; rerunning resumes where it stopped.
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from leap_jax.train import loop  # noqa: E402
from probe import corpus  # noqa: E402
from probe import pipeline  # noqa: E402


def main(argv):
  cfg = loop.parse_config(argv)
  echo = lambda s: print(s, flush=True)  # noqa: E731
  out = pipeline.corpus_dir(cfg)
  model, tokenizer = pipeline.load_generator(cfg, echo)
  source = pipeline.make_source(cfg, model, tokenizer)
  with pipeline.make_evaluator(cfg) as evaluator:
    solver = pipeline.make_solver(cfg, evaluator)
    records = corpus.build_corpus(
        out, source=source, solver=solver, checker=pipeline.make_checker(cfg), num_tasks=cfg.corpus.num_tasks,
        seed=cfg.seed, band=tuple(cfg.corpus.band), batch_size=cfg.generator.batch_size,
        metadata=pipeline.corpus_metadata(cfg), log=echo)
  summary = corpus.corpus_summary(records)
  print(f"corpus {out}: " + json.dumps(summary) + " " + pipeline.scale_note(cfg), flush=True)


if __name__ == "__main__":
  main(sys.argv)
