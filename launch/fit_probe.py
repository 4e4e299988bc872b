"""Fit and select the PROPEL probe: `python launch/fit_probe.py --config configs/propel_cpu.py [--relabel]`.

Reads the corpus (launch/build_corpus.py), extracts the frozen reference generator's pooled activations of each
valid task, fits a probe per (layer, L2), scores it by grouped cross-validation (eligible only when a lower
confidence bound on its AUROC is above 0.5) and by RVP over a fixed sample of base-generator generations, and saves
the RVP-best eligible probe, its reward scale set on that sample, to <workdir>/probe/probe.npz with report.json
(probe/selection.py). With no eligible probe it says so and saves the one of largest AUROC lower bound, marked
ineligible: launch/train_generator.py refuses it unless --config.probe.allow_ineligible=True.

--relabel: first re-runs K solver attempts on the corpus's tasks with the configured solver (e.g. a LEAP
checkpoint trained since the corpus was labelled) into <corpus>-relabel-<solver>, then fits on those labels.
"""
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

import kernels_eval  # noqa: E402
from kernels_eval import task as task_lib  # noqa: E402
from launch import cli  # noqa: E402
from leap_jax.train import build  # noqa: E402
from probe import activations  # noqa: E402
from probe import corpus  # noqa: E402
from probe import generator  # noqa: E402
from probe import linear  # noqa: E402
from probe import pipeline  # noqa: E402
from probe import selection  # noqa: E402

flags.DEFINE_bool("relabel", False, "re-run the configured solver on the corpus tasks before fitting")
RVP_SEED_OFFSET = 1 << 20  # RVP sample i uses task_seed(seed, RVP_SEED_OFFSET + i), disjoint from the corpus


def relabel(cfg, records, echo):
  with build.make_evaluator(cfg.evaluator) as evaluator:
    solver = pipeline.make_solver(cfg.solver, evaluator, cfg.lang, cfg.seed)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", solver.metadata["checkpoint"])
    corpus_dir = pathlib.Path(cfg.corpus.dir)
    out = corpus_dir.with_name(corpus_dir.name + f"-relabel-{name}")
    echo(f"relabelling {len(records)} corpus tasks with solver {solver.metadata['checkpoint']} into {out}")
    return corpus.build_corpus(out, source=corpus.RecordedSource(records), solver=solver,
                               checker=pipeline.make_checker(cfg.generator), num_tasks=len(records), seed=cfg.seed,
                               band=cfg.corpus.band, batch_size=cfg.generator.batch_size,
                               metadata=pipeline.corpus_metadata(cfg), log=echo)


def rvp_sample(cfg, model, tokenizer, echo) -> list[dict]:
  """The fixed base-generator sample (generated once, stored in <workdir>/probe/rvp_sample.jsonl)."""
  path = pipeline.probe_dir(cfg) / "rvp_sample.jsonl"
  if path.is_file():
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    if len(rows) == cfg.probe.rvp_samples:
      return rows
  source = pipeline.make_source(cfg.generator, model, tokenizer)
  checker = pipeline.make_checker(cfg.generator, remember=False)
  seeds = [corpus.task_seed(cfg.seed, RVP_SEED_OFFSET + i) for i in range(cfg.probe.rvp_samples)]
  rows = []
  for start in range(0, len(seeds), cfg.generator.batch_size):
    chunk = seeds[start:start + cfg.generator.batch_size]
    for s, reply in zip(chunk, source.generate(chunk)):
      c = checker.check(generator.extract_task_source(reply))
      rows.append({"seed": s, "text": c.text, "valid": c.valid, "reason": c.reason})
    echo(f"RVP sample: {len(rows)}/{len(seeds)} generated, {sum(r['valid'] for r in rows)} valid")
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return rows


def main(argv):
  cfg = cli.propel_config(argv)
  echo = lambda s: print(s, flush=True)  # noqa: E731
  records = corpus.read_records(cfg.corpus.dir)
  if not records:
    raise SystemExit(f"error: no corpus records in {cfg.corpus.dir}; run launch/build_corpus.py first")
  if flags.FLAGS.relabel:
    records = relabel(cfg, records, echo)
  band, built = cfg.corpus.band, tuple(corpus.read_meta(cfg.corpus.dir)["band"])
  if band != built:
    echo(f"labels: corpus.band {band} applied to the stored pass counts (the corpus was built with band {built})")
  records = corpus.with_band(records, band)
  labelled = [r for r in records if r.valid]
  if not labelled:
    raise SystemExit("error: the corpus has no valid tasks to fit a probe on")
  y = np.array([r.label for r in labelled])
  rate = np.array([r.solve_rate for r in labelled])
  echo(f"corpus: {len(records)} generations, {len(labelled)} valid, {int(y.sum())} in band")
  if len(set(y.tolist())) < 2:
    raise SystemExit(f"error: all {len(y)} valid corpus tasks have label {int(y[0])}; a probe needs in-band and "
                     "out-of-band tasks (more tasks, another band, or another solver)")
  model, tokenizer = pipeline.load_generator(cfg.generator, cfg.workdir, cfg.seed, echo)
  layers = cfg.probe.layers or (activations.default_layer(model.config.num_layers),)
  rows = rvp_sample(cfg, model, tokenizer, echo)
  tasks = [task_lib.parse_task_source(r.text, "<corpus>") for r in labelled]
  texts = [activations.task_text(t, cfg.lang) for t in tasks]
  rvp_texts = [activations.task_text(task_lib.parse_task_source(r["text"], "<rvp>"), cfg.lang)
               for r in rows if r["valid"]]
  features, rvp_features = {}, {}
  for layer in layers:
    extractor = pipeline.make_extractor(cfg, model, tokenizer, layer)
    features[layer] = extractor(texts)
    rvp_features[layer] = extractor(rvp_texts) if rvp_texts else np.zeros((0, extractor.width), np.float32)
  best, table = selection.fit_and_select(
      features, y, rate, selection.task_groups(tasks, cfg.probe.cv_groups), rvp_features,
      rvp_invalid=sum(not r["valid"] for r in rows), l2s=cfg.probe.l2s, hidden=cfg.probe.hidden,
      r_bad=cfg.probe.r_bad, num_folds=cfg.probe.cv_folds, alpha=cfg.probe.alpha, seed=cfg.seed,
      steps=cfg.probe.steps)
  out = pipeline.probe_dir(cfg)
  out.mkdir(parents=True, exist_ok=True)
  linear.save_probe(out / "probe.npz", best["params"])
  report = {"chosen": {k: v for k, v in best.items() if k != "params"}, "candidates": table,
            "corpus": cfg.corpus.dir, "relabelled": bool(flags.FLAGS.relabel), "band": list(band),
            "model_id": pipeline.generator_id(cfg.generator, cfg.seed), "scale": cfg.scale,
            "evaluator_version": kernels_eval.schema.SCHEMA_VERSION}
  (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
  for row in table:
    echo("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
  if best["eligible"]:
    echo(f"chosen probe (max RVP among eligible): layer {best['layer']}, l2 {best['l2']:g}, AUROC lower bound "
         f"{best['auroc_lower']:.3f} -> {out / 'probe.npz'} " + cfg.scale_note)
  else:
    echo(f"NO ELIGIBLE PROBE: no candidate's AUROC lower bound (grouped {best['n_folds']}-fold CV, "
         f"{best['n_groups']} groups, level {best['alpha']:.2g}) is above 0.5, so none has shown skill; saved the "
         f"one of largest bound ({best['auroc_lower']:.3f}: layer {best['layer']}, l2 {best['l2']:g}) marked "
         "ineligible, which launch/train_generator.py refuses unless --config.probe.allow_ineligible=True "
         + cfg.scale_note)


if __name__ == "__main__":
  main(sys.argv)
