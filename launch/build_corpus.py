"""Labelled PROPEL corpus: `python launch/build_corpus.py --config configs/propel_cpu.py [--config.<f>=<v> ...]`.

N generations of the frozen reference generator; each valid task gets K solver attempts and the label
y = 1[a <= passes <= b]. Records are written durably as they finish; rerunning resumes where it stopped.
"""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from launch import cli  # noqa: E402
from leap_jax.train import build  # noqa: E402
from probe import corpus  # noqa: E402
from probe import pipeline  # noqa: E402


def main(argv):
  cfg = cli.propel_config(argv)
  echo = lambda s: print(s, flush=True)  # noqa: E731
  out = pathlib.Path(cfg.corpus.dir)
  model, tokenizer = pipeline.load_generator(cfg.generator, cfg.workdir, cfg.seed, echo)
  source = pipeline.make_source(cfg.generator, model, tokenizer)
  with build.make_evaluator(cfg.evaluator) as evaluator:
    solver = pipeline.make_solver(cfg.solver, evaluator, cfg.lang, cfg.seed)
    records = corpus.build_corpus(
        out, source=source, solver=solver, checker=pipeline.make_checker(cfg.generator), num_tasks=cfg.corpus.num_tasks,
        seed=cfg.seed, band=cfg.corpus.band, batch_size=cfg.generator.batch_size,
        metadata=pipeline.corpus_metadata(cfg), log=echo)
  summary = corpus.corpus_summary(records)
  print(f"corpus {out}: " + json.dumps(summary) + " " + cfg.scale_note, flush=True)


if __name__ == "__main__":
  main(sys.argv)
