"""Finds the kernel source in a model reply: fenced code blocks, last or best one."""
from __future__ import annotations

import re

from kernels_eval import backends

CUDA_FENCE_TAGS = ("cuda", "cu", "cpp", "c++", "c", "")
# KernelBench's CUDA answer is a Python file (ModelNew + load_inline), asked for in a ```python block.
KERNELBENCH_CUDA_FENCE_TAGS = ("python", "py", "")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


class NoCodeBlock(ValueError):
  """No usable code block; str(e) is the message returned to the model as feedback."""


def _tags_and_marker(lang: str, task) -> tuple[tuple[str, ...], str]:
  """The fence tags that fit `lang` for `task`, and the name the best block defines."""
  if lang == "cuda" and getattr(task, "kernelbench", None) is not None:
    return KERNELBENCH_CUDA_FENCE_TAGS, "ModelNew"
  try:
    return backends.get(lang).fence_tags, "solution"
  except ValueError:
    if lang != "cuda":
      raise
    return CUDA_FENCE_TAGS, "solution"


def extract_code(response_text: str, lang: str, task=None) -> str:
  """The source of the best fenced block for `lang` (```python, ```cuda, ```cpp or a bare ```).

  The task decides the answer format: a KernelBench task (`task.kernelbench` set) in "cuda" takes
  KernelBench's ModelNew file from a ```python (or bare) block; every other task the language's tags.
  Among blocks whose tag fits, the last one that defines `solution` (KernelBench CUDA: `ModelNew`) wins,
  else the last one. An unclosed final fence counts up to the end of the reply. Raises NoCodeBlock otherwise.
  """
  tags, marker = _tags_and_marker(lang, task)
  blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(response_text or "")]
  fitting = [body for tag, body in blocks if tag in tags and body.strip()]
  if not fitting:
    wanted = ", ".join(f"```{t}" if t else "a bare ```" for t in tags[:3])
    found = f" (found blocks tagged {sorted({t or 'bare' for t, _ in blocks})})" if blocks else ""
    raise NoCodeBlock(f"no {lang} code block in the reply{found}: put the code the contract asks for in one "
                      f"fenced block ({wanted}).")
  with_marker = [b for b in fitting if re.search(rf"\b{marker}\b", b)]
  return (with_marker or fitting)[-1].strip("\n") + "\n"
