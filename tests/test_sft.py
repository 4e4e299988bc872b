"""Cold-start SFT: examples match the rollout's turn-1 prompt, masks, the truncated-gradient loss, learning."""
import jax
import numpy as np
import optax
import pytest
from flax import nnx

import kernels_eval
from kernels_eval.skeleton import fill_skeleton
from configs import smoke
from leap_jax.models import ModelConfig, Transformer
from leap_jax.rollout import prompts
from leap_jax.sampling import ChatFormat
from leap_jax.train import build, sft
from leap_jax.train.config import TrainConfig

TINY = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)


def _examples():
  rng = np.random.default_rng(0)
  return [sft.SFTExample(f"t{i}", tuple(rng.integers(1, 64, n).tolist()), tuple(rng.integers(1, 64, r).tolist()))
          for i, (n, r) in enumerate([(20, 5), (13, 9), (30, 3)])]


def test_pack_masks_reply_tokens_only():
  ex = _examples()
  packed = sft.pack(ex, length_multiple=8)
  assert packed["tokens"].shape == (3, 40)
  np.testing.assert_array_equal(packed["loss_mask"].sum(1), [5, 9, 3])
  assert packed["loss_mask"][0, 20] and not packed["loss_mask"][0, 19] and not packed["loss_mask"][0, 25]
  split = sft.pack_split(ex, length_multiple=8)
  np.testing.assert_array_equal(split["prefix_len"], [19, 12, 29])
  assert split["segment"][1, 0] == ex[1].prompt[-1]
  np.testing.assert_array_equal(split["segment"][1, 1:10], ex[1].reply)
  np.testing.assert_array_equal(split["target_mask"].sum(1), [5, 9, 3])


def test_truncated_gradient_has_the_exact_loss_and_both_modes_learn():
  histories = {}
  for prompt_grad in (True, False):
    model = Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0))
    histories[prompt_grad] = sft.run_sft(model, _examples(), optax.adam(3e-2), steps=8, batch_size=3, seed=0,
                                         prompt_grad=prompt_grad)
  # Step 0 evaluates the same batch at the same initial parameters: the two losses are the same number.
  assert histories[True][0]["nll"] == pytest.approx(histories[False][0]["nll"], rel=1e-5)
  for history in histories.values():
    assert history[-1]["nll"] < 0.75 * history[0]["nll"]


def test_examples_use_the_rollout_prompt_and_a_fenced_trusted_solution():
  cfg = smoke.get_config()
  tokenizer = build.load_tokenizer_from(cfg.model.tokenizer)
  chat = ChatFormat(tokenizer)
  tasks = sft.sft_tasks(TrainConfig.from_dict(cfg.to_dict()).sft, cfg.tasks.lang)
  assert {t.level for t in tasks} == {0, 1} and all(t.split == "train" for t in tasks)
  assert {"row_mean", "transpose"} <= {t.id for t in tasks}
  task = tasks[0]
  (example,) = sft.build_examples([task], chat, tokenizer, "pallas")
  rollout_prompt = chat.first_turn(kernels_eval.render_task(task, "pallas"), prompts.system_message("pallas"))
  assert list(example.prompt) == rollout_prompt
  assert example.reply[-1] == chat.stop_ids[0]
  code = kernels_eval.extract_code(chat.decode(example.reply[:-1]), "pallas")
  assert task.level == 0 and "def solution" not in code  # level 0: only the lines the skeleton leaves out
  assert fill_skeleton(task, "pallas", code).strip() == task.solutions["pallas"].strip()
  (level1,) = sft.build_examples([t for t in tasks if t.id == "transpose"], chat, tokenizer, "pallas")
  code = kernels_eval.extract_code(chat.decode(level1.reply[:-1]), "pallas")
  assert code.strip() == next(t for t in tasks if t.id == "transpose").solutions["pallas"].strip()
  with pytest.raises(ValueError, match="no SFT examples|SFT has no examples"):
    sft.run_sft(Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0)), [], optax.sgd(0.1), steps=1,
                batch_size=1, seed=0)


def test_examples_sharing_a_prompt_run_it_once_with_the_same_updates():
  """Two prompts, each with three replies: the shared-prefix batch gives the per-example losses and updates."""
  rng = np.random.default_rng(1)
  prompts_ = [tuple(rng.integers(1, 64, n).tolist()) for n in (17, 23)]
  examples = [sft.SFTExample(f"t{i}", prompts_[i % 2], tuple(rng.integers(1, 64, 3 + i).tolist())) for i in range(6)]
  packed = sft.pack(examples, length_multiple=8)
  np.testing.assert_array_equal(packed["group_ids"], [0, 1, 0, 1, 0, 1])
  split = sft.prompt_split(packed)
  assert split.num_groups == 2 and split.group_size == 3 and list(split.prefix_len) == [17, 23]
  params = {}
  for shared in (True, False):
    model = Transformer(ModelConfig.from_hf_config(TINY), rngs=nnx.Rngs(0))
    history = sft.run_sft(model, examples, optax.sgd(0.5), steps=2, batch_size=6, seed=0, shared_prefix=shared)
    params[shared] = (history, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model))])
  for a, b in zip(params[True][0], params[False][0]):
    assert a["nll"] == pytest.approx(b["nll"], rel=1e-5) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
  for a, b in zip(params[True][1], params[False][1]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
