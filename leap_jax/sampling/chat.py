"""Chat turns rendered to token ids with a tokenizer's own chat template, one turn at a time.

A multi-turn episode is built by appending token ids, never by re-tokenising its history:

  turn 0:  first_turn(user, system)      -> [template prefix ... user message ... assistant generation prompt]
           the policy samples a completion (usually ending in a stop id such as <|im_end|>)
  turn t:  feedback_turn(text, previous) -> [end of the assistant message ... user message ... generation prompt]

`feedback_turn` renders, with the template itself, a conversation whose assistant message is a placeholder and
keeps the text after the placeholder. When the previous completion already ended with the token that closes an
assistant message, that token is not repeated.
"""
from __future__ import annotations

from typing import Any, Sequence

_PLACEHOLDER = "@@ASSISTANT_REPLY_7f3a@@"


class ChatFormat:
  """Per-turn chat rendering for any Hugging Face tokenizer with a chat template.

  Attributes:
    tokenizer: the tokenizer (needs `chat_template`, `apply_chat_template` and `encode`).
    stop_ids: tuple of ids that end an assistant message: the tokenizer's EOS id(s) and the special token the
      template puts right after an assistant message (e.g. <|im_end|>, <|eot_id|>, <end_of_turn>).
  """

  def __init__(self, tokenizer: Any):
    if getattr(tokenizer, "chat_template", None) is None:
      raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat template")
    self.tokenizer = tokenizer
    self.stop_ids = self._find_stop_ids()

  def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)

  def _encode(self, text: str) -> list[int]:
    return list(self.tokenizer.encode(text, add_special_tokens=False))

  def first_turn(self, user: str, system: str | None = None) -> list[int]:
    """Token ids of the opening turn: optional system message, the user message, the generation prompt."""
    _check_text("user", user)
    messages = [] if system is None else [{"role": "system", "content": _check_text("system", system)}]
    messages.append({"role": "user", "content": user})
    return self._encode(self._render(messages, add_generation_prompt=True))

  def feedback_turn(self, user: str, previous_completion: Sequence[int] = ()) -> list[int]:
    """Token ids that follow an assistant completion: its closing, the user message, the generation prompt.

    Args:
      user: the feedback text (e.g. compiler or test output).
      previous_completion: the ids the policy generated in the previous turn; when they end with the token that
        closes an assistant message, that token is not emitted again.
    """
    _check_text("user", user)
    ids = self._encode(self._suffix_after_reply(user))
    if previous_completion and ids and previous_completion[-1] == ids[0] and ids[0] in self.stop_ids:
      ids = ids[1:]
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def _suffix_after_reply(self, user: str) -> str:
    messages = [{"role": "user", "content": "question"},
                {"role": "assistant", "content": _PLACEHOLDER},
                {"role": "user", "content": user}]
    text = self._render(messages, add_generation_prompt=True)
    at = text.rfind(_PLACEHOLDER)
    if at < 0:
      raise ValueError("the chat template does not render assistant messages verbatim; cannot split turns")
    return text[at + len(_PLACEHOLDER):]

  def _find_stop_ids(self) -> tuple[int, ...]:
    eos = getattr(self.tokenizer, "eos_token_id", None)
    stops = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]
    closing = self._encode(self._suffix_after_reply("next"))
    special = set(getattr(self.tokenizer, "all_special_ids", ()))
    added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
    if closing and (closing[0] in special or closing[0] in added) and closing[0] not in stops:
      stops.append(closing[0])
    return tuple(int(s) for s in stops)


def _check_text(name: str, value: Any) -> str:
  if not isinstance(value, str):
    raise TypeError(f"{name} message must be a str, got {type(value).__name__}")
  return value
