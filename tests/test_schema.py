"""EvalResult: validation, JSON round trip, feedback cap and conversion to reward arrays."""
import json

import numpy as np
import pytest

from kernels_eval import schema


def _result(status="correct", **kw):
  return schema.EvalResult(status=status, stage="correctness", task_id="t", lang="pallas", **kw)


def test_round_trip_preserves_every_field():
  r = _result(trials_passed=5, trials_total=5, max_abs_error=1e-6, flags=["fast"],
              timing=schema.Timing(kernel_ms=1.0, reference_ms=2.0, speedup=2.0),
              first_mismatches=[{"index": [0, 1], "got": 1.0, "expected": 2.0}])
  r.provenance.durations["static"] = 0.01
  back = schema.EvalResult.from_json(r.to_json())
  assert back == r
  assert json.loads(r.to_json())["schema_version"] == schema.SCHEMA_VERSION


@pytest.mark.parametrize("field,value,match", [
    ("status", "passed", "status='passed'"),
    ("stage", "run", "stage='run'"),
])
def test_bad_status_or_stage_names_the_field(field, value, match):
  kw = dict(status="correct", stage="static")
  kw[field] = value
  with pytest.raises(ValueError, match=match):
    schema.EvalResult(**kw)


def test_unknown_field_and_version_are_rejected():
  d = _result().to_dict()
  with pytest.raises(ValueError, match="unknown fields"):
    schema.EvalResult.from_dict({**d, "bogus": 1})
  with pytest.raises(ValueError, match="schema_version 99"):
    schema.EvalResult.from_dict({**d, "schema_version": 99})


def test_feedback_is_capped_in_bytes():
  r = _result(status="wrong_output", feedback="é" * 5000)
  assert len(r.feedback.encode()) <= schema.FEEDBACK_MAX_BYTES
  assert r.feedback.endswith("[... feedback truncated]")


def test_success_excludes_not_run_and_infra_errors():
  assert _result().success
  assert not _result(status="not_run").success
  infra = _result(infra_error="worker died")
  assert not infra.success and not infra.valid


def test_results_to_arrays_shapes_and_values():
  rs = [_result(), _result(status="wrong_output"), _result(infra_error="x"),
        _result(timing=schema.Timing(1.0, 3.0, 3.0)), _result(status="not_run"), _result(status="timeout")]
  arrays = schema.results_to_arrays(rs, (2, 3))
  np.testing.assert_array_equal(arrays["success"], [[True, False, False], [True, False, False]])
  np.testing.assert_array_equal(arrays["valid"], [[True, True, False], [True, True, True]])
  assert arrays["status"][1, 2] == schema.STATUS_CODE["timeout"]
  assert arrays["speedup"][1, 0] == 3.0 and np.isnan(arrays["speedup"][0, 0])
  with pytest.raises(ValueError, match="got 6 results for shape"):
    schema.results_to_arrays(rs, (2, 2))
