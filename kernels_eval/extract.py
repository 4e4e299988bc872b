"""Finds the kernel source in a model reply: fenced code blocks, last or best one."""
from __future__ import annotations

import re

from kernels_eval import backends

CUDA_FENCE_TAGS = ("cuda", "cu", "cpp", "c++", "c", "")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


class NoCodeBlock(ValueError):
  """No usable code block; str(e) is the message returned to the model as feedback."""


def extract_code(response_text: str, lang: str) -> str:
  """The source of the best fenced block for `lang` (```python, ```cuda, ```cpp or a bare ```).

  Among blocks whose tag fits `lang`, the last one that defines `solution` wins, else the last one.
  An unclosed final fence counts up to the end of the reply. Raises NoCodeBlock otherwise.
  """
  try:
    tags = backends.get(lang).fence_tags
  except ValueError:
    if lang != "cuda":
      raise
    tags = CUDA_FENCE_TAGS
  blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(response_text or "")]
  fitting = [body for tag, body in blocks if tag in tags and body.strip()]
  if not fitting:
    wanted = ", ".join(f"```{t}" if t else "a bare ```" for t in tags[:3])
    found = f" (found blocks tagged {sorted({t or 'bare' for t, _ in blocks})})" if blocks else ""
    raise NoCodeBlock(f"no {lang} code block in the reply{found}: put the code the contract asks for in one "
                      f"fenced block ({wanted}).")
  with_solution = [b for b in fitting if re.search(r"\bsolution\b", b)]
  return (with_solution or fitting)[-1].strip("\n") + "\n"
