"""PROPEL for kernel tasks: a generator of tasks in the suite's format, a labelled corpus, activation probes that
predict whether a task sits at the solver's learning frontier, and the probe reward for generator RL.

Public API:
  fit_linear_probe(features[N,d], labels[N], *, l2, hidden=0, ...) -> ProbeParams
  probe_predict(params, features[N,d]) -> logits[N]
  with_reward_scale(params, reference_logits[M]) -> ProbeParams; probe_reward_logits(params, features) -> f32[N]
  fit_ridge(features, solve_rates, *, l2) -> ProbeParams               diagnostic regression on s/K
  save_probe(path, params), load_probe(path)
  balanced_accuracy, auroc, auroc_lower_bound, spearman, expected_calibration_error, rvp, probe_report
  fit_and_select(features_by_layer, labels, solve_rate, groups, rvp_features, rvp_invalid, *, l2s) -> (best, table)
  usable_probe(path, *, allow_ineligible) -> (params, report row)      refuses probes without shown skill
  ActivationExtractor(model, tokenizer, *, model_id, layer, cache_dir)(texts) -> f32[N, D]   cache keyed by weights
  self_bleu(texts), distinct_n(texts, n)                               diversity of generated tasks (audits)
  generator_prompt, suite_examples, extract_task_source, TaskChecker(...).check(text) -> GeneratedTask,
  normalized_hash, export_tasks(texts, folder)
  scaffold.skeleton(task, output_shape), scaffold.witness(reference)   level-0 skeletons written by the harness
  build_corpus(out_dir, *, source, solver, checker, num_tasks, seed, band) -> list[Record]; read_records, task_seed,
  with_band(records, band)                                             labels of another band, same passes
  ModelTaskSource, RolloutSolver                                        model-backed generator and real solver
  ProbeReward(extractor, probes, *, r_bad)(checked) -> f32[n]
  sample_generations(...) -> GeneratorRollout (TrainBatch for the LEAP learner), audit(...) -> (metrics, records)
"""
from probe.activations import ActivationExtractor, default_layer
from probe.corpus import (Record, RecordedSource, build_corpus, corpus_summary, read_meta, read_records, task_seed,
                          with_band)
from probe.diversity import distinct_n, self_bleu
from probe.generator import (GeneratedTask, TaskChecker, export_tasks, extract_task_source, generator_prompt,
                             normalized_hash, strip_solutions, suite_examples)
from probe.generator_rl import GeneratorRollout, audit, sample_generations, step_seeds
from probe.linear import (ProbeParams, fit_linear_probe, fit_ridge, load_probe, probe_predict, probe_reward_logits,
                          save_probe, with_reward_scale)
from probe.metrics import (auroc, auroc_lower_bound, balanced_accuracy, expected_calibration_error, probe_report, rvp,
                           spearman)
from probe.reward import ProbeReward
from probe.selection import fit_and_select, usable_probe
from probe.sources import ModelTaskSource, RolloutSolver

__all__ = [
    "ActivationExtractor", "GeneratedTask", "GeneratorRollout", "ModelTaskSource", "ProbeParams", "ProbeReward",
    "Record", "RecordedSource", "RolloutSolver", "TaskChecker", "audit", "auroc", "auroc_lower_bound",
    "balanced_accuracy", "build_corpus", "corpus_summary", "default_layer", "distinct_n",
    "expected_calibration_error", "export_tasks", "extract_task_source", "fit_and_select", "fit_linear_probe",
    "fit_ridge", "generator_prompt", "load_probe", "normalized_hash", "probe_predict", "probe_report",
    "probe_reward_logits", "read_meta", "read_records", "rvp", "sample_generations", "save_probe", "self_bleu",
    "spearman", "step_seeds", "strip_solutions", "suite_examples",
    "task_seed", "usable_probe", "with_band", "with_reward_scale",
]
