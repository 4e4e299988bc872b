"""Input checks shared by the reward functions: rank and dtype first, with the argument named."""
import numbers

import chex
import jax
import jax.numpy as jnp


def array(x, name: str, fn: str, rank: int, kind) -> jax.Array:
  """Returns `x` as an array after asserting its rank and dtype kind (bool, int or float)."""
  x = jnp.asarray(x)
  chex.assert_rank(x, rank, custom_message=f"{fn}: `{name}` must have rank {rank}")
  chex.assert_type(x, kind, custom_message=f"{fn}: `{name}` must have dtype kind {kind.__name__}")
  return x


def same_shape(arrays, names, fn: str, dims: int) -> None:
  """Asserts the arrays agree on their first `dims` dimensions."""
  chex.assert_equal_shape_prefix(
      arrays, dims, custom_message=f"{fn}: {', '.join(f'`{n}`' for n in names)} must share their "
      f"first {dims} dimensions")


def valid_mask(valid, shape, fn: str) -> jax.Array:
  """bool[P,G]: `valid`, or all True when it is None."""
  if valid is None:
    return jnp.ones(shape, dtype=bool)
  valid = array(valid, "valid", fn, 2, bool)
  chex.assert_shape(valid, tuple(shape), custom_message=f"{fn}: `valid` must have shape [P,G]={tuple(shape)}")
  return valid


def discount(gamma, fn: str) -> None:
  """Rejects a concrete discount outside [0, 1]; traced values pass through unchecked."""
  if isinstance(gamma, numbers.Real) and not 0.0 <= gamma <= 1.0:
    raise ValueError(f"{fn}: gamma={gamma} must lie in [0, 1]")
