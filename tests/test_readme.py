"""README.md stays a short guide that matches the code: the method table, its size, the quick start, the paths."""
import pathlib
import re

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
MAX_BYTES = 10_500
BEGIN = "<!-- methods-table:begin -->"
END = "<!-- methods-table:end -->"
REGENERATE = 'python -c "from leap_jax.rollout import methods; print(methods.table_markdown())"'


@pytest.fixture(scope="module")
def readme() -> str:
  return README.read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
  match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
  assert match, f"README.md has no '## {title}' section"
  return match.group(1)


def test_methods_table_matches_the_registry(readme):
  from leap_jax.rollout import methods
  assert readme.count(BEGIN) == 1 and readme.count(END) == 1, f"README.md needs one {BEGIN} ... {END} block"
  block = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
  want = methods.table_markdown().strip()
  assert block == want, (
      f"README.md's methods table is out of date. Regenerate it with\n  {REGENERATE}\n"
      f"and paste the output between the lines {BEGIN} and {END}.")


def test_readme_is_short():
  size = README.stat().st_size
  assert size <= MAX_BYTES, (f"README.md is {size} bytes (limit {MAX_BYTES}): it is the guide; dated "
                             "measurements and run logs belong in docs/results.md")


def test_quick_start_is_make_train_and_make_test(readme):
  quick = _section(readme, "Quick start")
  for command in ("make train", "make test"):
    assert command in quick, f"the README's quick start must show `{command}`"


def test_mentioned_launch_and_config_files_exist(readme):
  mentioned = sorted(set(re.findall(r"\b((?:launch|configs)/[A-Za-z0-9_]+\.py)\b", readme)))
  assert mentioned, "README.md names no launch/*.py or configs/*.py file"
  missing = [path for path in mentioned if not (REPO_ROOT / path).is_file()]
  assert not missing, f"README.md names files that do not exist: {missing}"
