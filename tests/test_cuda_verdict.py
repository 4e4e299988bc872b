"""Harness checks and timing flags on arrays, payload helpers and nvcc log trimming (no compiler)."""
import numpy as np
import pytest

from kernels_eval.cuda import compile as compile_lib
from kernels_eval.cuda import gpu_job
from kernels_eval.cuda import verdict

TOL = {"atol": 1e-4, "rtol": 1e-4}


def test_harness_findings_in_order_of_severity():
  assert verdict.harness_findings(0, 0, [], ["x"])[0] == "no_kernel_launched"
  assert verdict.harness_findings(2, 1, [(0, 0)], ["x"])[0] == "extra_stream"
  reason, message = verdict.harness_findings(3, 0, [(0, 1), (2, 1)], ["x", "y"])
  assert reason == "input_mutation" and "y" in message and "trial(s) 1, 3" in message
  assert verdict.harness_findings(5, 0, [], ["x"]) is None


def test_determinism_tolerates_reordered_sums_only():
  rng = np.random.default_rng(0)
  first = rng.normal(size=(64,)).astype(np.float32)
  assert verdict.determinism(first, first + np.float32(1e-7), TOL) is None
  shifted = first.copy()
  shifted[3] += 1.0
  reason, message = verdict.determinism(first, shifted, TOL)
  assert reason == "nondeterministic" and "1 of 64" in message
  nan = first.copy()
  nan[0] = np.nan
  assert verdict.determinism(first, nan, TOL)[0] == "nondeterministic"


def test_roofline_flag():
  # 2 x 64 MiB in + 64 MiB out at 4.8 TB/s: about 0.042 ms.
  bound = verdict.roofline_ms(2 * (64 << 20), 64 << 20)
  assert bound == pytest.approx(3 * (64 << 20) / 4.8e12 * 1e3)
  assert verdict.roofline_flags(0.05, bound) == []
  assert verdict.roofline_flags(0.01, bound) == ["faster_than_roofline"]


def test_payload_signature_and_dims_groups():
  payload = {"task": {"input_names": ["x", "w"], "dim_names": ["M", "K"]}, "input_dtypes": ["float16", "float16"],
             "trial_dims": [{"K": 3, "M": 5}, {"K": 8, "M": 8}, {"M": 5, "K": 3}]}
  sig = gpu_job.signature(payload)
  assert sig.dim_names == ("M", "K") and sig.output_dtype == "float16"
  assert gpu_job.dims_groups(payload["trial_dims"]) == [[0, 2], [1]]
  del payload["task"]["dim_names"]
  payload["timing_dims"] = {"M": 64, "K": 32}
  assert gpu_job.signature(payload).dim_names == ("M", "K")


def test_trim_log_keeps_errors_and_context_only():
  log = ("solution.cu(3): warning #550-D: variable \"t\" was set but never used\n  int t = 0;\n      ^\n\n"
         "Remark: The warnings can be suppressed\n\n"
         "solution.cu(7): error: identifier \"nope\" is undefined\n  out[i] = nope;\n          ^\n\n"
         "kernels_eval_harness(4): error: argument of type \"const float *\" is incompatible\n  solution(...)\n\n"
         "2 errors detected in the compilation of \"solution.cu\".\n")
  text = compile_lib.trim_log(log, prototype="PROTO")
  assert text.splitlines()[0] == 'solution.cu:7: error: identifier "nope" is undefined'
  assert "out[i] = nope;" in text and "warning" not in text and "Remark" not in text
  assert "does not match the required prototype" in text and "expected: PROTO" in text
  assert "errors detected" not in text
  long_log = "\n".join(f"solution.cu({i}): error: e{i}" for i in range(1, 60))
  assert compile_lib.trim_log(long_log).endswith(f"[... {59 - compile_lib.FEEDBACK_LINES} more lines]")
