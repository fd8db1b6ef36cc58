"""Checks of values: at once when they are concrete, in `checkify` when they are traced.

A check of concrete values (an eager call, variables closed over by a jitted function)
raises a one-line ValueError at once. Traced values (under `jit`, `pmap`, a scan) have no
values yet: where a failed check would make a result wrong, the result is NaN instead
(`poison`), and tracing inside `checkify` turns the checks into errors with their
message, as `jax.experimental.checkify.checkify` does:

    step = jax.jit(br.checks.checkify(train_step))
    error, outputs = step(state, batch)
    error.throw()          # checkify.JaxRuntimeError, with the first failed check's line

Static facts (shapes, T against `max_length`) are checked while tracing, always.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify as checkify_lib

_TRACED_CHECKS = contextvars.ContextVar('bn_rnn_jax_traced_checks', default=False)


def traced_checks_on() -> bool:
  """Whether the function being traced runs inside `checkify`."""
  return _TRACED_CHECKS.get()


def _is_traced(*values) -> bool:
  return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def check(ok, message: str, *args: Any):
  """Raise `ValueError(message.format(*args))` where `ok` (a bool array) is not all True.

  Concrete `ok` and `args`: now, and returns True. Traced: a `checkify` check when
  tracing inside `checkify`, and returns `jnp.all(ok)` (traced), for a caller that makes
  its results NaN where the check fails (`poison`). `args` are scalars (`{}` placeholders
  in `message`)."""
  if _is_traced(ok, args):
    ok = jnp.all(ok)
    if traced_checks_on():
      checkify_lib.check(ok, message, *args)
    return ok
  if not np.all(np.asarray(ok)):
    raise ValueError(message.format(*(np.asarray(a).item() for a in args)))
  return True


def poison(tree, ok):
  """`tree`'s floating leaves, NaN where the traced check `ok` failed (as it is when `ok`
  is True): a failed check of traced values shows as a NaN loss, never as a silently
  wrong number."""
  if ok is True:
    return tree
  return jax.tree.map(lambda a: jnp.where(ok, a, jnp.nan) if jnp.issubdtype(
      a.dtype, jnp.floating) else a, tree)


def checkify(fn: Callable) -> Callable:
  """`fn` with this library's checks of traced values on: returns `(error, outputs)`, as
  `jax.experimental.checkify.checkify(fn, errors=user_checks)`; `error.throw()` raises the
  first failed check's message. Jit the result (not `fn` alone), so that the checks are
  traced into the compiled program."""
  @functools.wraps(fn)
  def with_checks(*args, **kwargs):
    token = _TRACED_CHECKS.set(True)
    try:
      return fn(*args, **kwargs)
    finally:
      _TRACED_CHECKS.reset(token)
  return checkify_lib.checkify(with_checks, errors=checkify_lib.user_checks)
