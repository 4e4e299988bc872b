"""Chat turns and episodes: per-turn ids equal the template's rendering of the whole conversation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from leap_jax.sampling import ChatFormat, Episode, Sampler, SamplingParams, sequence_logprobs, stack_episodes

TINY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }} {{ m['content'] }}<|end|>"
                 "{% endfor %}{% if add_generation_prompt %}<|start|>assistant {% endif %}")
WORDS = ["system", "user", "assistant", "be", "brief", "write", "a", "kernel", "here", "it", "is", "error",
         "line", "fix", "question", "next"]


@pytest.fixture(scope="session")
def tiny_tokenizer():
  vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<|start|>", "<|end|>"] + WORDS)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                 additional_special_tokens=["<|start|>", "<|end|>"],
                                 chat_template=TINY_TEMPLATE)


@pytest.fixture(scope="session")
def smollm(embedded_model):
  model, tokenizer = embedded_model
  graphdef, state = nnx.split(model)
  return model.config, graphdef, state, tokenizer


def whole(tokenizer, system, user, reply, feedback):
  messages = [{"role": "system", "content": system}, {"role": "user", "content": user},
              {"role": "assistant", "content": reply}, {"role": "user", "content": feedback}]
  text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  return tokenizer.encode(text, add_special_tokens=False)


def check_turns_concatenate(tokenizer, system, user, reply, feedback, closing):
  chat = ChatFormat(tokenizer)
  assert closing in chat.stop_ids
  first = chat.first_turn(user, system=system)
  reply_ids = tokenizer.encode(reply, add_special_tokens=False)
  want = whole(tokenizer, system, user, reply, feedback)
  stopped = reply_ids + [closing]
  assert first + stopped + chat.feedback_turn(feedback, stopped) == want
  # A completion cut by the length limit has no closing token: the feedback turn supplies it.
  assert first + reply_ids + chat.feedback_turn(feedback, reply_ids) == want


def test_tiny_tokenizer_turns(tiny_tokenizer):
  end = tiny_tokenizer.convert_tokens_to_ids("<|end|>")
  check_turns_concatenate(tiny_tokenizer, "be brief", "write a kernel", "here it is", "error line", end)
  chat = ChatFormat(tiny_tokenizer)
  assert set(chat.stop_ids) == {tiny_tokenizer.eos_token_id, end}
  assert chat.first_turn("write a kernel")[0] == tiny_tokenizer.bos_token_id


def test_embedded_tokenizer_turns(smollm):
  tokenizer = smollm[3]
  end = tokenizer.convert_tokens_to_ids("<|im_end|>")
  check_turns_concatenate(tokenizer, "You write CUDA.", "Write a ReLU kernel.",
                          "```cuda\n__global__ void relu(float* x) {}\n```", "error: expected ';'", end)


def test_missing_template_and_bad_text(tiny_tokenizer):
  bare = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer.backend_tokenizer)
  with pytest.raises(ValueError, match="no chat template"):
    ChatFormat(bare)
  with pytest.raises(TypeError, match="user message must be a str"):
    ChatFormat(tiny_tokenizer).first_turn(["write"])


def test_episode_records_and_stacks():
  e = Episode()
  e.add_prompt([1, 2, 3])
  with pytest.raises(ValueError, match="no completion yet"):
    e.add_prompt([4])
  e.add_completion([7, 8], [-0.5, -0.25], "length")
  e.add_prompt([4])
  e.add_completion([9], [-1.0], "stop")
  with pytest.raises(ValueError, match="finish_reason"):
    Episode(tokens=[1], turns=[0], policy=[False], logprobs=[0.0]).add_completion([2], [-1.0], "done")
  with pytest.raises(ValueError, match="log-probs"):
    Episode(tokens=[1], turns=[0], policy=[False], logprobs=[0.0]).add_completion([2], [], "stop")
  assert e.num_turns == 2 and e.completion(0) == [7, 8] and e.prompt(1) == [4]
  short = Episode()
  short.add_prompt([5])
  arrays = stack_episodes([e, short], length=8, pad_id=0)
  np.testing.assert_array_equal(arrays["tokens"][0], [1, 2, 3, 7, 8, 4, 9, 0])
  np.testing.assert_array_equal(arrays["policy_mask"][0], [0, 0, 0, 1, 1, 0, 1, 0])
  np.testing.assert_array_equal(arrays["turns"][0], [0, 0, 0, 0, 0, 1, 1, -1])
  np.testing.assert_allclose(arrays["sampler_logprobs"][0], [0, 0, 0, -0.5, -0.25, 0, -1.0, 0])
  np.testing.assert_array_equal(arrays["input_mask"][1], [1, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(arrays["lengths"], [7, 1])
  with pytest.raises(ValueError, match="more than length"):
    stack_episodes([e], length=4)


def test_embedded_model_two_turn_episode(smollm):
  """Two batched turns of the real model; the learner's log-probs over the episode match the sampler's."""
  cfg, graphdef, state, tokenizer = smollm
  chat = ChatFormat(tokenizer)
  sampler = Sampler(graphdef, cfg, cache_len=128, stop_ids=chat.stop_ids, pad_id=tokenizer.pad_token_id)
  params = SamplingParams(temperature=0.8, top_k=50)
  users = ["Write a CUDA ReLU kernel.", "Say hi."]
  episodes = [Episode() for _ in range(4)]
  prompts = [chat.first_turn(u, system="You are a GPU expert.") for u in users]
  st, outs = sampler.start(state, prompts, 2, jax.random.key(0), max_new_tokens=8, sampling=params)
  for e, c in zip(episodes, outs):
    e.add_prompt(prompts[c.row // 2])
    e.add_completion(c.tokens, c.logprobs, c.finish_reason)
  rows = [0, 3]
  feedback = [chat.feedback_turn("error: no __global__ function", episodes[r].completion(0)) for r in rows]
  st, outs = sampler.continue_(state, st, rows, feedback, jax.random.key(1), max_new_tokens=8, sampling=params)
  for r, f, c in zip(rows, feedback, outs):
    episodes[r].add_prompt(f)
    episodes[r].add_completion(c.tokens, c.logprobs, c.finish_reason)
    assert st.lengths[r] == len(episodes[r])
  arrays = stack_episodes(episodes, length=64)
  learner = sequence_logprobs(graphdef, state, jnp.asarray(arrays["tokens"]), jnp.asarray(arrays["policy_mask"]),
                              temperature=0.8, chunk_size=32)
  np.testing.assert_allclose(np.asarray(learner), arrays["sampler_logprobs"], atol=2e-4)
  assert arrays["policy_mask"].sum() >= 4 * 1 + 2
