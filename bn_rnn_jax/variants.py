"""The papers' layers by name.

`VARIANTS` maps a name to the `RecurrentLayer` fields that make it; `make_layer(name,
features, **fields)` builds one with any field overridden:

  lstm               gates = W_h h + W_x x + b                        baseline
  bn_lstm            gates = BN(W_h h; γ_h) + BN(W_x x; γ_x) + b,     Cooijmans eq. 14-16
                     h = σ(o) tanh(BN(c; γ_c, β_c)); per-step statistics
  bn_lstm_shared     the same, statistics shared over time            Cooijmans' ablation
  bn_input_only      gates = W_h h + BN(W_x x; γ, b), frame-wise      Laurent eq. 18
  bn_input_only_seq  the same, sequence-wise statistics (batch and    Laurent eq. 20-21
                     time, padding excluded)
  ln_lstm            layer norm on the same three sites (γ init 1)    Ba et al. 2016
  rnn                h = tanh(W_h h + W_x x + b)                      baseline
  rnn_bn_input       h = tanh(W_h h + BN(W_x x; γ, b))                Laurent eq. 18
  rnn_bn_recurrence  h = tanh(BN(W_h h + W_x x; γ, β))                Laurent eq. 17, App. A

Stacks and models take a layer as their template (`StackedRNN(layer=make_layer(...))`),
cloned per layer and direction, as `nn.RNN` takes its cell.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

from bn_rnn_jax import initializers
from bn_rnn_jax import recurrent

#: The papers' layers by name: `{name: RecurrentLayer fields}` (the table above).
VARIANTS: dict[str, dict[str, Any]] = {
    'lstm': dict(cell='lstm'),
    'bn_lstm': dict(cell='lstm', recurrent_norm='batch', input_norm='batch',
                    cell_norm='batch'),
    'bn_lstm_shared': dict(cell='lstm', recurrent_norm='batch', input_norm='batch',
                           cell_norm='batch', statistics='shared'),
    'bn_input_only': dict(cell='lstm', input_norm='batch'),
    'bn_input_only_seq': dict(cell='lstm', input_norm='batch', statistics='sequence'),
    'ln_lstm': dict(cell='lstm', recurrent_norm='layer', input_norm='layer',
                    cell_norm='layer',
                    scale_init=initializers.Constant(1.0)),
    'rnn': dict(cell='rnn'),
    'rnn_bn_input': dict(cell='rnn', input_norm='batch'),
    'rnn_bn_recurrence': dict(cell='rnn', recurrent_norm='batch'),
}

_FIELDS = frozenset(f.name for f in dataclasses.fields(recurrent.RecurrentLayer)
                    if f.name not in ('parent', 'name'))


def check_fields(fields: Mapping[str, Any]) -> None:
  """A one-line error naming any key of `fields` that is no `RecurrentLayer` field."""
  unknown = sorted(set(fields) - _FIELDS)
  if unknown:
    hints = [difflib.get_close_matches(name, _FIELDS, n=1) for name in unknown]
    hint = ''.join(f' ({name}: did you mean {h[0]!r}?)' for name, h in zip(unknown, hints)
                   if h)
    raise ValueError(f'Unknown RecurrentLayer fields {unknown}{hint}.')


def make_layer(variant: str, features: int, **fields) -> recurrent.RecurrentLayer:
  """A `RecurrentLayer` of the `VARIANTS` preset `variant`, with any field overridden.

  Example:
    >>> import bn_rnn_jax as br
    >>> layer = br.make_layer('bn_input_only_seq', 100, max_length=784, name='encoder')
    >>> layer.cell, layer.input_norm, layer.recurrent_norm, layer.statistics
    ('lstm', 'batch', None, 'sequence')
  """
  if variant not in VARIANTS:
    raise ValueError(f'Unknown RNN variant {variant!r}; choose one of {sorted(VARIANTS)}.')
  name = fields.pop('name', None)
  fields = {**VARIANTS[variant], **fields}
  check_fields(fields)
  return recurrent.RecurrentLayer(features=features, name=name, **fields)
