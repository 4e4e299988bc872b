"""Output checks, done in the parent (never in the process that ran candidate code).

Any shape works, 0-d outputs (losses) included. An output passes when its shape and dtype match the reference, every element satisfies
|out - ref| <= atol + rtol * |ref| (NaN/inf must match exactly), and the relative L2 error
||out - ref||_2 / ||ref||_2 <= min(0.05, 10 * rtol), so that all-zero or near-zero outputs fail even
when the reference's magnitude is below atol.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

MAX_MISMATCHES_SHOWN = 3


@dataclasses.dataclass
class Comparison:
  ok: bool
  message: str = ""
  max_abs_error: float | None = None
  max_rel_error: float | None = None
  mismatch_count: int | None = None
  first_mismatches: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def rel_l2_tolerance(rtol: float) -> float:
  return min(0.05, 10.0 * rtol) if rtol > 0 else 0.0


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> Comparison:
  out, ref = np.asarray(out), np.asarray(ref)
  if out.shape != ref.shape:
    return Comparison(False, f"output shape {list(out.shape)} != expected {list(ref.shape)}")
  if out.dtype != ref.dtype:
    return Comparison(False, f"output dtype {out.dtype.name} != expected {ref.dtype.name}")
  a, b = out.astype(np.float64), ref.astype(np.float64)
  with np.errstate(invalid="ignore", over="ignore"):
    diff = np.abs(a - b)
    finite = np.isfinite(b)
    same_special = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
    bad = np.where(finite, ~(diff <= atol + rtol * np.abs(b)), ~same_special)
    fd = np.where(finite & np.isfinite(a), diff, 0.0)
    max_abs = float(fd.max()) if fd.size else 0.0
    max_rel = float((fd / np.maximum(np.abs(b), 1e-30)).max()) if fd.size else 0.0
    ref_norm = float(np.linalg.norm(np.where(finite, b, 0.0)))
    err_norm = float(np.linalg.norm(np.where(finite, a - b, 0.0)))
  count = int(bad.sum())
  mism = [{"index": [int(i) for i in idx], "got": float(a[tuple(idx)]), "expected": float(b[tuple(idx)])}
          for idx in np.argwhere(bad)[:MAX_MISMATCHES_SHOWN]] if count else []
  common = dict(max_abs_error=max_abs, max_rel_error=max_rel, mismatch_count=count, first_mismatches=mism)
  if count:
    shown = "; ".join(f"at {m['index']}: got {m['got']:.6g}, expected {m['expected']:.6g}" for m in mism)
    return Comparison(False, f"{count} of {b.size} elements differ beyond atol={atol:g}, rtol={rtol:g} "
                      f"(max abs error {max_abs:.3g}); first: {shown}", **common)
  l2_tol = rel_l2_tolerance(rtol)
  if ref_norm > 0 and err_norm > l2_tol * ref_norm:
    return Comparison(False, f"relative L2 error {err_norm / ref_norm:.3g} exceeds {l2_tol:g} (elementwise "
                      "within tolerance, but the output is off as a whole, e.g. all zeros)", **common)
  return Comparison(True, "", **common)
