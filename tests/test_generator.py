"""Task generator: prompt and parse checks, export to a task folder, and GRPO steps through the real probe reward.

Toy setup: a tiny random generator writes a task's STATEMENT (a few words) into a fixed, novel task file, so
validity (parse, sandbox validation, duplicate check) is real and reachable; the probe is fit on the frozen
reference model's activations of such tasks, labelled by a textual feature of the statement.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import kernels_eval
from configs import smoke
from kernels_eval import task as task_lib
from leap_jax.sampling import ChatFormat, Sampler, SamplingParams
from leap_jax.train import build
from leap_jax.train.config import TrainConfig
from leap_jax.train.learner import Learner, LearnerConfig
from probe import activations
from probe import corpus
from probe import generator
from probe import generator_rl
from probe import generator_sft
from probe import linear
from probe import reward as reward_lib
from probe import sources
from test_probe_activations import tiny_model, word_tokenizer

WORDS = ("alpha beta gamma delta omega zebra yak lion tiger wolf bear fox owl hawk crow swan duck frog toad newt "
         "moss fern oak elm ash pine fir yew").split()
TASK = '''import jax.numpy as jnp

ID = "toy_task"
LEVEL = 1
SPLIT = "train"
FAMILY = "activation"
STATEMENT = {statement!r}
DIMS = {{"check": [{{"M": 33, "N": 70}}], "timing": {{"M": 1024, "N": 1024}}}}
INPUTS = [{{"name": "x", "shape": ["M", "N"], "dtype": "float32", "dist": {{"kind": "normal"}}}}]


def reference(x):
  return jnp.tanh(x) * 1.5 + x
'''


def toy_text(reply: str) -> str:
  return TASK.format(statement=reply.strip())


def test_prompt_has_examples_without_solutions():
  examples = generator.suite_examples()
  assert examples and all("SOLUTIONS" not in e and "def reference" in e for e in examples)
  prompt = generator.generator_prompt(examples, num_shots=3, seed=4)
  assert prompt.count("```python") == 4 and "Do not write any solution" in prompt
  assert prompt == generator.generator_prompt(examples, num_shots=3, seed=4)
  with pytest.raises(ValueError, match="num_shots"):
    generator.generator_prompt(examples, num_shots=0)


def test_checks_carry_reasons(tmp_path):
  suite = kernels_eval.load_tasks()
  checker = generator.TaskChecker(cache_dir=tmp_path)
  original = generator.strip_solutions(open(suite[15].path).read())
  renamed = original.replace(f'ID = "{suite[15].id}"', 'ID = "other_name"').replace("STATEMENT = (", "STATEMENT = (\n'x' ")
  assert checker.check(renamed).reason.startswith("duplicate:")
  bad = checker.check(toy_text("ok").replace("jnp.tanh(x) * 1.5 + x", "jnp.zeros_like(x)"))
  assert not bad.valid and bad.reason.startswith("invalid:") and "ignores_input" in bad.reason
  assert checker.check("LEVEL = 1\n").reason == "parse: ID: is missing"
  assert checker.check(toy_text("")).reason.startswith("parse: STATEMENT")
  good = checker.check(toy_text("square it"))
  assert good.valid and good.reason == "" and good.family == "activation"
  assert checker.check(toy_text("another wording")).reason.startswith("duplicate:")
  reply = f"Sure.\n```python\n{toy_text('hi')}```\nDone."
  assert generator.extract_task_source(reply) == toy_text("hi")


def test_level0_tasks_get_the_harness_scaffold(tmp_path):
  examples = generator.suite_examples((0,))
  assert examples and all("SKELETON" not in e and "SOLUTIONS" not in e for e in examples)
  prompt = generator.generator_prompt(examples, num_shots=2, seed=1, levels=(0,))
  assert "LEVEL (0 complete the kernel body)" in prompt and "no SKELETON: the harness writes" in prompt
  assert "0 complete" not in generator.generator_prompt(generator.suite_examples(), num_shots=2, seed=1)
  relu = next(t for t in kernels_eval.load_tasks() if t.id == "relu")
  new = generator.strip_solutions(open(relu.path).read()).replace("jnp.maximum(x, 0.0)", "jnp.maximum(x, 0.5)")
  assert "SKELETON" not in new
  assert generator.TaskChecker(cache_dir=tmp_path).check(new).reason == "parse: LEVEL: 0 is not one of (1, 2, 3)"
  checker = generator.TaskChecker(levels=(0,), cache_dir=tmp_path)
  assert checker.check(toy_text("level one")).reason == "parse: LEVEL: 1 is not one of (0,)"
  checked = checker.check(new)
  assert checked.valid, checked.reason
  assert checked.task.skeleton["pallas"] == relu.skeleton["pallas"]  # the suite's scaffold, from the harness
  [path] = generator.export_tasks([checked.text], tmp_path / "pool")
  [task] = kernels_eval.load_tasks(tmp_path / "pool")
  assert task.level == 0 and task.id == path.stem and task.skeleton == checked.task.skeleton
  answer, wrong = (kernels_eval.evaluate(task, line, "pallas", stages="correctness")
                   for line in ("out = jnp.maximum(x, 0.5)", "out = jnp.maximum(x, 0.0)"))
  assert answer.status == "correct" and wrong.status == "wrong_output", (answer.feedback, wrong.feedback)
  # A row-wise reference whose output keeps the input's shape: elementwise scaffold, but blocks of 128
  # columns cannot see the whole row, so the reference's own body fails there and the task is refused.
  softmax = new.replace("jnp.maximum(x, 0.5)", "jax.nn.softmax(x, axis=1)")
  refused = checker.check(softmax)
  assert not refused.valid and refused.reason.startswith(
      "scaffold: the reference's own body does not complete the skeleton (wrong_output"), refused.reason
  column_sums = new.replace("jnp.maximum(x, 0.5)", "jnp.sum(x, axis=0)")
  assert checker.check(column_sums).reason.startswith("scaffold: no level-0 scaffold for inputs x['M', 'N'] -> "
                                                      "output of shape [300]")


def test_export_loads_as_task_folder(tmp_path):
  texts = [toy_text("a"), toy_text("b"), TASK.format(statement="c").replace("1.5", "2.5")]
  paths = generator.export_tasks(texts, tmp_path / "pool")
  assert len(paths) == 2  # the first two are near-duplicates
  tasks = kernels_eval.load_tasks(tmp_path / "pool")
  assert {t.id for t in tasks} == {p.stem for p in paths} and all(t.split == "train" for t in tasks)
  cfg = smoke.get_config()  # the LEAP trainer's task pool, pointed at the exported folder
  cfg.tasks.folder, cfg.tasks.levels = str(tmp_path / "pool"), (0, 1, 2, 3)
  config = TrainConfig.from_dict(cfg.to_dict())
  pool = build.pool_tasks(config.tasks)
  assert sorted(t.id for t in pool) == sorted(t.id for t in tasks) and not any(t.trusted for t in pool)
  assert build.dry_run(config)["tasks"] == len(tasks)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
  examples = ["Write words like " + " ".join(WORDS)]
  tok = word_tokenizer([generator.instructions(), examples[0], TASK, " ".join(WORDS),
                        kernels_eval.render_task(kernels_eval.load_tasks()[12], "pallas")])
  chat = ChatFormat(tok)
  model = tiny_model(len(tok), layers=1, width=32)
  graphdef, params = nnx.split(model)
  ref_params = jax.tree.map(jnp.array, params)
  sampler = Sampler(graphdef, model.config, cache_len=2048, stop_ids=chat.stop_ids, pad_id=0)
  source = sources.ModelTaskSource(sampler, params, chat, examples, num_shots=1, max_new_tokens=6,
                                   sampling=SamplingParams(temperature=1.0))
  extractor = activations.ActivationExtractor(nnx.merge(graphdef, ref_params), tok, model_id="toy", layer=1,
                                              batch_size=16, max_tokens=96)
  rng = np.random.default_rng(0)
  statements = [" ".join(rng.choice(WORDS, 5)) for _ in range(96)]
  lexical = set(WORDS[:14])
  labels = np.array([sum(w in lexical for w in s.split()) >= 3 for s in statements], np.int32)
  feats = extractor([kernels_eval.render_task(task_lib.parse_task_source(toy_text(s), "<toy>"), "pallas")
                     for s in statements])
  probe = linear.fit_linear_probe(feats, labels, l2=1e-2, steps=300)
  checker = generator.TaskChecker(cache_dir=tmp_path_factory.mktemp("vcache"), remember=False)
  return dict(source=source, graphdef=graphdef, params=params, ref_params=ref_params, checker=checker,
              reward=reward_lib.ProbeReward(extractor, [probe], r_bad=-0.2), chat=chat)


def test_model_source_reply_depends_only_on_its_seed(toy):
  src = toy["source"]
  first = src.generate([11, 22])
  second = src.generate([22, 33])  # same batch shape, seed 22 in another row next to another seed
  assert second[0] == first[1] and len(set(first + second)) == 3


def test_grpo_steps_move_the_probe_reward(toy):
  source, checker, reward = toy["source"], toy["checker"], toy["reward"]
  optim = optax.adam(3e-3)
  learner = Learner.for_model(toy["graphdef"], optim, LearnerConfig(kl_beta=0.05, aggregation="sequence_mean"),
                              chunk_size=None)
  state = learner.init_state(jax.tree.map(jnp.array, toy["params"]), seed=0)
  eval_seeds = corpus.task_seed(1, 0), corpus.task_seed(1, 1)

  def mean_reward(params):
    out = generator_rl.sample_generations(source, params, checker, reward, eval_seeds, 32, jax.random.key(5),
                                          pad_id=0, to_text=toy_text)
    return float(out.rewards.mean()), out

  before, first = mean_reward(state.params)
  assert first.batch.tokens.shape[0] == 64 and first.rewards.shape == (2, 32)
  valid = np.array([c.valid for c in first.checked])
  assert valid.any() and np.all(first.rewards.reshape(-1)[~valid] == np.float32(-0.2))
  for step in range(6):
    seeds = generator_rl.step_seeds(3, step, 4)
    out = generator_rl.sample_generations(source, state.params, checker, reward, seeds, 8,
                                          jax.random.key(100 + step), pad_id=0, to_text=toy_text)
    state, m = learner.step(state, out.batch, ref_params=toy["ref_params"])
    assert np.isfinite(m["loss"])
  after, _ = mean_reward(state.params)
  print(f"toy generator GRPO: mean probe reward {before:.3f} -> {after:.3f} after 6 steps")
  assert after > before + 0.3, (before, after)


def test_generator_sft_examples_hold_out_their_target():
  tok = build.load_tokenizer_from("smollm2-135m-instruct")
  chat = ChatFormat(tok)
  examples = generator.suite_examples((0,))
  pairs = generator_sft.sft_examples(examples, chat, tok, num_shots=1, levels=(0,), seed=0, per_task=2)
  assert len(pairs) == 2 * len(examples)
  for i, pair in enumerate(pairs):
    target = examples[i // 2].strip()
    prompt, reply = tok.decode(pair.prompt), tok.decode(pair.reply[:-1])
    assert reply == f"```python\n{target}\n```" and pair.reply[-1] == chat.stop_ids[0]
    assert target not in prompt and prompt.count("```python\n") == 1 and "LEVEL (0 complete" in prompt
  with pytest.raises(ValueError, match="num_shots"):
    generator_sft.sft_examples(examples[:1], chat, tok, num_shots=1, levels=(0,), seed=0)
