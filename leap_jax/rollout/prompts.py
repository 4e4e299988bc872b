"""Chat messages of an episode: the system message, the task, and feedback turns.

The task text is `kernels_eval.render_task(task, lang)`: statement, inputs, reference and the
kernel contract of the language.

An episode is a list of {"role", "content"} messages. Turn 1 is [system, user(task)]; after
each evaluated reply the next user message carries the evaluator's verdict and feedback.
Two context policies decide what the policy sees at turn t+1:
  "episode": the whole conversation so far (KV-cache continuation);
  "latest":  a fresh [system, user] pair with the statement, the latest code and its feedback.
"""
from __future__ import annotations

from kernels_eval import skeleton

CONTEXT_POLICIES = ("episode", "latest")

_LANGUAGE = {
    "pallas": ("JAX Pallas (Triton dialect)", "python"),
    "cuda": ("CUDA C++", "cuda"),
}

def _check_lang(lang: str) -> None:
  if lang not in _LANGUAGE:
    raise ValueError(f"unknown kernel language {lang!r}; choose one of {sorted(_LANGUAGE)}")


def fence(lang: str) -> str:
  """The code-fence tag replies use for `lang`."""
  _check_lang(lang)
  return _LANGUAGE[lang][1]


def system_message(lang: str) -> str:
  """Role, language and reply format (the kernel contract itself is part of `render_task`'s text)."""
  _check_lang(lang)
  name, tag = _LANGUAGE[lang]
  return (f"You are an expert GPU kernel engineer writing {name} kernels. Follow the task's kernel "
          f"contract exactly and reply with the code it asks for in a single ```{tag} fenced code block.")


def first_turn(lang: str, task_text: str) -> list[dict[str, str]]:
  """Turn-1 messages: [system, user(rendered task)]."""
  return [{"role": "system", "content": system_message(lang)}, {"role": "user", "content": task_text}]


def verdict_text(status: str, feedback: str, truncated: bool) -> str:
  """One paragraph describing an evaluation outcome."""
  if truncated:
    return "Your reply was cut off before it finished; no complete code block was found."
  text = f"Evaluation result: {status}."
  return f"{text}\n{feedback.strip()}" if feedback.strip() else text


def feedback_turn(lang: str, status: str, feedback: str, truncated: bool = False) -> dict[str, str]:
  """The user message that opens turn t+1 under the "episode" context policy."""
  return {"role": "user", "content": (
      f"{verdict_text(status, feedback, truncated)}\n"
      f"Fix the kernel and reply with the corrected code, as the contract asks, in one ```{fence(lang)} block.")}


def latest_context(lang: str, task_text: str, code: str, status: str, feedback: str,
                   truncated: bool = False) -> list[dict[str, str]]:
  """Turn t+1 messages under the "latest" context policy: statement, latest code and its feedback."""
  tag = fence(lang)
  attempt = f"Your previous attempt:\n```{tag}\n{code.strip()}\n```\n" if code.strip() else ""
  user = (f"{task_text}\n\n{attempt}{verdict_text(status, feedback, truncated)}\n"
          f"Fix the kernel and reply with the corrected code, as the contract asks, in one ```{tag} block.")
  return [{"role": "system", "content": system_message(lang)}, {"role": "user", "content": user}]


def solution_reply(lang: str, code: str) -> str:
  """An assistant reply holding `code` in the requested format."""
  return f"```{fence(lang)}\n{code.strip()}\n```"


def trusted_reply(task, lang: str) -> str:
  """The reply a task's contract asks for, built from its trusted solution (the SFT target): for a level-0
  task with a skeleton only the lines that replace the marker, otherwise the whole source."""
  if skeleton.has_skeleton(task, lang):
    return solution_reply(lang, skeleton.skeleton_answer(task, lang))
  return solution_reply(lang, task.solutions[lang])
