"""Float64 NumPy reference of the BN-RNN equations, for the tests only.

Written from docs/design.md ("The equations") and the papers, not from the JAX code: nothing
here imports `bn_rnn_jax`. Everything is a plain Python loop over time and over the batch
wherever that makes the equation easier to read; speed does not matter (tiny shapes).

Conventions shared with the library's public API (the names are the API, the maths is
re-derived here):
  * inputs `x [B, T, I]`, mask `[B, T]` (1 = valid; the valid steps are a prefix),
    outputs `[B, T, H]` (0 at padded steps), LSTM carry `(c, h)`, RNN carry `h`.
  * gate order (f, i, o, g); parameter names `input_kernel [I, G*H]`,
    `recurrent_kernel [H, G*H]`, `bias [G*H]`, `input_scale`, `recurrent_scale` (LSTM) or
    `scale` (RNN), `cell_scale`, `cell_bias`.
  * a padded step keeps the previous state and never counts in a statistic.

Equations (docs/design.md):
  BN(z; g, b) = b + g * (z - mean(z)) / sqrt(var(z) + eps), biased variance over the
    valid rows of the batch (frame-wise / per step) or over valid rows and steps
    (sequence-wise, Laurent eq. 20-21).
  LSTM:     gates = N_h(W_h h) + N_x(W_x x) + b;  c = s(f) c' + s(i) tanh(g);
            h = s(o) tanh(N_c(c)).
  tanh RNN: h = tanh(W_h h' + N_x(W_x x) + b)          (Laurent eq. 18)
            h = tanh(BN(W_h h' + W_x x; gamma, b))      (Laurent appendix A)
  Population statistics: one row per step, step t reads row min(t, last row seen in
  training) (Cooijmans sec. 3); a running average (first update takes the batch value) or
  the average of minibatch moments over the minibatches that reached the row.
"""

from __future__ import annotations

import numpy as np

# The variants, spelled out from the papers (site -> normalisation kind).
VARIANT_SPECS = {
    'lstm': dict(cell='lstm'),
    'bn_lstm': dict(cell='lstm', recurrent='batch', input='batch', cell_site='batch'),
    # Statistics shared over time for the population estimate of the recurrent and cell
    # terms (Cooijmans' ablation), sequence-wise statistics of the input term.
    'bn_lstm_shared': dict(cell='lstm', recurrent='batch', input='batch',
                           cell_site='batch', shared=True, input_stats='sequence'),
    'bn_input_only': dict(cell='lstm', input='batch'),
    'bn_input_only_seq': dict(cell='lstm', input='batch', input_stats='sequence'),
    'ln_lstm': dict(cell='lstm', recurrent='layer', input='layer', cell_site='layer'),
    'rnn': dict(cell='rnn'),
    'rnn_bn_input': dict(cell='rnn', input='batch'),
    'rnn_bn_recurrence': dict(cell='rnn', recurrent='batch'),
}


def spec(variant: str) -> dict:
  """Normalised spec: cell, recurrent, input, cell_site, shared, input_stats."""
  out = dict(cell='lstm', recurrent=None, input=None, cell_site=None, shared=False,
             input_stats='frame')
  out.update(VARIANT_SPECS[variant])
  return out


def sigmoid(z):
  return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow on the junk of padded rows


# ----------------------------------------------------------------------------- moments


def masked_moments(z, valid):
  """Mean and biased variance of the valid rows.

  Args:
    z: `[N, F]` values (rows = batch entries, or batch-and-time entries flattened).
    valid: `[N]` booleans.

  Returns:
    `(mean [F], var [F], count)`. With no valid row the statistic is 0 / 0 (the
    library clamps the count at 1 to avoid NaN; the values of such a step are never used
    by a valid row).
  """
  z = np.asarray(z, np.float64)
  rows = z[np.asarray(valid, bool)]
  count = rows.shape[0]
  if count == 0:
    return np.zeros(z.shape[1]), np.zeros(z.shape[1]), 0
  mean = rows.sum(0) / count
  var = ((rows - mean) ** 2).sum(0) / count
  return mean, var, count


def normalize(z, mean, var, scale=None, shift=None, eps=1e-5):
  y = (z - mean) / np.sqrt(var + eps)
  if scale is not None:
    y = y * scale
  if shift is not None:
    y = y + shift
  return y


def layer_norm(z, scale=None, shift=None, eps=1e-5):
  mean = z.mean(-1, keepdims=True)
  var = ((z - mean) ** 2).mean(-1, keepdims=True)
  return normalize(z, mean, var, scale, shift, eps)


# ----------------------------------------------------------------------------- layer


def _norm_site(kind, z, valid, scale, shift, *, train, pop, eps, min_count=1, fallback=None):
  """Normalise `z [B, F]` by kind. Returns `(y, (mean, var, count) or None)`.

  In training, a step with fewer than `min_count` valid rows is normalised with
  `fallback = (mean, var)` (population rows) instead of its own moments."""
  if kind is None:
    y = z if scale is None else z * scale
    return (y if shift is None else y + shift), None
  if kind == 'layer':
    return layer_norm(z, scale, shift, eps), None
  if train:
    mean, var, count = masked_moments(z, valid)
    if fallback is not None and count < min_count:
      return normalize(z, *fallback, scale, shift, eps), (mean, var, count)
    return normalize(z, mean, var, scale, shift, eps), (mean, var, count)
  mean, var = pop
  return normalize(z, mean, var, scale, shift, eps), None


def run_layer(params, x, mask, variant, *, train=True, population=None, eps=1e-5,
              initial_carry=None, min_step_count=1, fallback=None):
  """Naive step-by-step run of one recurrent layer.

  Args:
    params: dict of float arrays (names as in the module docstring).
    x: `[B, T, I]`.
    mask: `[B, T]` (or None = all valid).
    variant: a key of `VARIANT_SPECS`.
    train: batch statistics (True) or population statistics (False).
    population: in inference, `{site: (mean [T, F], var [T, F])}` per-step rows already
      looked up (see `population_lookup`).
    eps: variance epsilon.
    initial_carry: `(c, h)` or `h`, `[B, H]`; zeros when None.
    min_step_count, fallback: in training, a per-step statistic over fewer than
      `min_step_count` valid rows is replaced by the step's row of `fallback`
      (`{site: (mean [T, F], var [T, F])}`, looked up like `population`).

  Returns:
    `(final_carry, outputs [B, T, H], moments)` with `moments[site]` a list over steps of
    `(mean, var, count)` (training only; for sequence-wise input statistics,
    `moments['input']` is one such tuple).
  """
  s = spec(variant)
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  x = np.asarray(x, np.float64)
  batch, length, _ = x.shape
  mask = np.ones((batch, length)) if mask is None else np.asarray(mask, np.float64)
  hidden = p['recurrent_kernel'].shape[0]
  if initial_carry is None:
    h = np.zeros((batch, hidden))
    c = np.zeros((batch, hidden))
  elif s['cell'] == 'lstm':
    c, h = (np.asarray(a, np.float64) for a in initial_carry)
  else:
    h = np.asarray(initial_carry, np.float64)
    c = None
  moments = {'input': [], 'recurrent': [], 'cell': []}
  population = population or {}
  fallback = fallback or {}

  # Sequence-wise input statistics: one mean/var over all valid (row, step) frames.
  input_terms = None
  if s['input'] == 'batch' and s['input_stats'] == 'sequence':
    z = x @ p['input_kernel']                                              # [B, T, G*H]
    flat = z.reshape(batch * length, -1)
    valid = mask.reshape(-1) > 0
    if train:
      mean, var, count = masked_moments(flat, valid)
      moments['input'] = (mean, var, count)
    else:
      mean, var = (a[0] for a in population['input'])  # one row, shared over time
    input_terms = normalize(z, mean, var, p['input_scale'], None, eps)

  outputs = np.zeros((batch, length, hidden))
  for t in range(length):
    valid = mask[:, t] > 0
    pop_t = {site: (m[t], v[t]) for site, (m, v) in population.items()}
    guard = {site: dict(min_count=min_step_count, fallback=(m[t], v[t]))
             for site, (m, v) in fallback.items()}
    if input_terms is not None:
      input_term = input_terms[:, t]
    else:
      input_term, mom = _norm_site(s['input'], x[:, t] @ p['input_kernel'], valid,
                                   p.get('input_scale'), None, train=train,
                                   pop=pop_t.get('input'), eps=eps, **guard.get('input', {}))
      if mom is not None:
        moments['input'].append(mom)
    if s['cell'] == 'lstm':
      rec, mom = _norm_site(s['recurrent'], h @ p['recurrent_kernel'], valid,
                            p.get('recurrent_scale'), None, train=train,
                            pop=pop_t.get('recurrent'), eps=eps,
                            **guard.get('recurrent', {}))
      if mom is not None:
        moments['recurrent'].append(mom)
      gates = rec + input_term + p['bias']
      f, i, o, g = np.split(gates, 4, axis=-1)
      c_new = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
      c_out, mom = _norm_site(s['cell_site'], c_new, valid, p.get('cell_scale'),
                              p.get('cell_bias'), train=train, pop=pop_t.get('cell'),
                              eps=eps, **guard.get('cell', {}))
      if mom is not None:
        moments['cell'].append(mom)
      h_new = sigmoid(o) * np.tanh(c_out)
      c = np.where(valid[:, None], c_new, c)
    else:
      pre = h @ p['recurrent_kernel'] + input_term
      if s['recurrent'] is None:
        pre = pre + p['bias']
      else:
        pre, mom = _norm_site(s['recurrent'], pre, valid, p['scale'], p['bias'],
                              train=train, pop=pop_t.get('recurrent'), eps=eps,
                              **guard.get('recurrent', {}))
        if mom is not None:
          moments['recurrent'].append(mom)
      h_new = np.tanh(pre)
    h = np.where(valid[:, None], h_new, h)
    outputs[:, t] = np.where(valid[:, None], h_new, 0.0)
  moments = {k: v for k, v in moments.items() if (isinstance(v, tuple) or v)}
  carry = (c, h) if s['cell'] == 'lstm' else h
  return carry, outputs, moments


def batch_sites(variant):
  """The sites normalised with batch statistics, each with whether it has one row."""
  s = spec(variant)
  sites = {}
  if s['recurrent'] == 'batch':
    sites['recurrent'] = s['shared']
  if s['input'] == 'batch':
    sites['input'] = s['input_stats'] == 'sequence'
  if s['cell_site'] == 'batch':
    sites['cell'] = s['shared']
  return sites


# ----------------------------------------------------------------------------- population


def minibatch_record(site_moments, shared, num_rows, min_count=1):
  """One minibatch's moments as `{'mean', 'var': [R, F], 'count': [R]}`: count n (the
  valid entries behind the row) on the rows the minibatch reached with at least
  `min_count` of them (per-step statistics; for a shared row, the steps that enter it),
  -n on rows it reached with fewer (thin: fresh values, no weight), 0 elsewhere.

  `site_moments` is a list over steps of `(mean, var, count)` (per-step statistics) or a
  single tuple (sequence-wise). A site whose population statistics are shared over time
  but whose training statistics are per step stores the average of the step moments,
  weighted by their valid counts ("averaging statistics over time", Cooijmans sec. 3).
  """
  thin_from = 1
  if isinstance(site_moments, tuple):
    site_moments = [site_moments]
  elif shared:  # steps that fell back on the population rows do not count
    site_moments = [(m, v, n if n >= min_count else 0.0) for m, v, n in site_moments]
  else:
    thin_from = min_count
  if shared and len(site_moments) > 1:
    counts = np.array([m[2] for m in site_moments], np.float64)
    total = counts.sum()
    w = counts / max(total, 1.0)
    mean = sum(wi * m[0] for wi, m in zip(w, site_moments))
    var = sum(wi * m[1] for wi, m in zip(w, site_moments))
    site_moments = [(mean, var, total)]
  features = site_moments[0][0].shape[0]
  rec = {'mean': np.zeros((num_rows, features)), 'var': np.ones((num_rows, features)),
         'count': np.zeros(num_rows)}
  for t, (mean, var, count) in enumerate(site_moments):
    if count >= thin_from and count > 0:
      rec['mean'][t], rec['var'][t], rec['count'][t] = mean, var, count
    elif count > 0:  # thin: reached, but by too few to count
      rec['count'][t] = -count
  return rec


def init_population(num_rows, features):
  return {'mean': np.zeros((num_rows, features)), 'var': np.ones((num_rows, features)),
          'count': np.zeros(num_rows)}


def ema_update(stats, record, momentum):
  """Running average on the rows the minibatch supported, row r moving by
  a_r = (1 - momentum) n_r / max n towards the batch value; a row's first update takes
  the batch value; other rows are left alone; count sums the valid counts."""
  out = {k: np.array(v, np.float64, copy=True) for k, v in stats.items()}
  weights = np.maximum(np.asarray(record['count'], np.float64), 0.0)
  for r in range(weights.shape[0]):
    if weights[r] <= 0:
      continue
    rate = (1 - momentum) * weights[r] / weights.max()
    for key in ('mean', 'var'):
      if stats['count'][r] <= 0:
        out[key][r] = record[key][r]
      else:
        out[key][r] = (1 - rate) * stats[key][r] + rate * record[key][r]
    out['count'][r] = stats['count'][r] + weights[r]
  return out


def average_records(records):
  """The estimate: per row, the average of the minibatch means and of the minibatch
  variances over the minibatches that supported that row, each weighted by its valid
  count (the papers' plain average when the counts are equal); unsupported rows (0, 1)."""
  num_rows, features = records[0]['mean'].shape
  out = init_population(num_rows, features)
  for r in range(num_rows):
    seen = [rec for rec in records if rec['count'][r] > 0]
    weights = np.array([rec['count'][r] for rec in seen], np.float64)
    out['count'][r] = weights.sum()
    if seen:
      out['mean'][r] = np.average([rec['mean'][r] for rec in seen], axis=0, weights=weights)
      out['var'][r] = np.average([rec['var'][r] for rec in seen], axis=0, weights=weights)
  return out


def steady_tail(stats, min_support):
  """Rows after the last one whose count reaches `min_support` times the largest take
  the moments of all the sequences of rows last // 2 .. last together: the count-weighted
  mean, and the count-weighted mean of var_r + (mean_r - mean)^2 (law of total
  variance); their count is the window's."""
  count = np.asarray(stats['count'], np.float64)
  mean_r, var_r = (np.asarray(stats[k], np.float64) for k in ('mean', 'var'))
  if count.shape[0] == 1:
    return {'mean': mean_r, 'var': var_r, 'count': count}
  last = max(r for r in range(count.shape[0]) if count[r] >= min_support * count.max())
  window = range(last // 2, last + 1)
  total = sum(count[r] for r in window)
  mean = sum(count[r] * mean_r[r] for r in window) / total
  var = sum(count[r] * (var_r[r] + (mean_r[r] - mean) ** 2) for r in window) / total
  out = {'mean': mean_r.copy(), 'var': var_r.copy(), 'count': count.copy()}
  for r in range(last + 1, count.shape[0]):
    out['mean'][r], out['var'][r], out['count'][r] = mean, var, total
  return out


def population_lookup(stats, length, min_support=0.0):
  """`(mean [length, F], var [length, F])`: step t reads row min(t, last row seen), of
  `steady_tail(stats, min_support)` with `min_support`."""
  if min_support > 0:
    stats = steady_tail(stats, min_support)
  seen = np.nonzero(np.asarray(stats['count']) > 0)[0]
  last = int(seen[-1]) if seen.size else 0
  rows = np.minimum(np.arange(length), last)
  return np.asarray(stats['mean'])[rows], np.asarray(stats['var'])[rows]


# ----------------------------------------------------------------------------- helpers


def reverse_each(x, mask):
  """Reverse each sequence's valid prefix in time; padding stays in place. x `[B, T, ...]`."""
  x = np.array(x, copy=True)
  lengths = np.asarray(mask).sum(1).astype(int)
  for b, n in enumerate(lengths):
    x[b, :n] = x[b, :n][::-1]
  return x


def numerical_grad(fn, arrays, step=1e-6):
  """Central finite differences of a scalar `fn(arrays)` w.r.t. every entry of every array.

  `arrays` is a dict of float64 arrays; returns a dict of gradients of the same shapes.
  """
  base = {k: np.array(v, np.float64, copy=True) for k, v in arrays.items()}
  grads = {}
  for key, value in base.items():
    g = np.zeros_like(value)
    flat = value.reshape(-1)
    for j in range(flat.size):
      old = flat[j]
      flat[j] = old + step
      up = fn(base)
      flat[j] = old - step
      down = fn(base)
      flat[j] = old
      g.reshape(-1)[j] = (up - down) / (2 * step)
    grads[key] = g
  return grads


def random_params(shapes, rng):
  """Random float64 parameters for the given `{name: shape}` (away from the init values,
  so that gamma, beta, biases and the forget bias all matter): kernels N(0, 1/fan_in),
  scales U(0.5, 1.5), biases N(0, 0.5^2)."""
  params = {}
  for name, shape in shapes.items():
    if name.endswith('kernel'):
      params[name] = rng.normal(0.0, 1.0 / np.sqrt(shape[0]), shape)
    elif name.endswith('scale') or name == 'scale':
      params[name] = rng.uniform(0.5, 1.5, shape)
    else:
      params[name] = rng.normal(0.0, 0.5, shape)
  return params


# ----------------------------------------------------------------------------- tagger
# A stacked bidirectional frame tagger (Laurent et al. sec. 5.1): each layer runs one
# direction in time order and the other on each sequence's reversed valid part (mapped
# back to time order), their outputs concatenated; a softmax at every step. Frame
# cross-entropy (FCE) and frame error rate (FER) average over the valid steps only.


def run_bidirectional_tagger(layers, softmax_kernel, softmax_bias, x, mask, variant):
  """Logits `[B, T, C]` and per-layer moments of a stacked bidirectional tagger.

  Args:
    layers: list over depth of `(forward_params, backward_params)` (as `run_layer`).
    softmax_kernel, softmax_bias: `[2H, C]`, `[C]`.
    x: `[B, T, I]` frames; mask `[B, T]`.
    variant: a key of `VARIANT_SPECS` (training mode: batch statistics).

  Returns:
    `(logits, moments)` with moments a list over depth of `(forward, backward)` moments.
  """
  h = np.asarray(x, np.float64)
  moments = []
  for forward, backward in layers:
    _, out_f, mom_f = run_layer(forward, h, mask, variant)
    _, out_b, mom_b = run_layer(backward, reverse_each(h, mask), mask, variant)
    h = np.concatenate([out_f, reverse_each(out_b, mask)], axis=-1)
    moments.append((mom_f, mom_b))
  logits = h @ np.asarray(softmax_kernel, np.float64) + np.asarray(softmax_bias, np.float64)
  return logits, moments


def frame_metrics(logits, labels, mask):
  """`(FCE, FER)` over the valid steps: mean -log softmax(logits)[label], mean error."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  valid = np.asarray(mask) > 0
  picked = np.take_along_axis(log_probs, np.asarray(labels)[..., None], -1)[..., 0]
  errors = (logits.argmax(-1) != np.asarray(labels))
  return float(-picked[valid].mean()), float(errors[valid].mean())


# ----------------------------------------------------------------------------- attentive reader
# The BN-e* layer: BN-LSTM with sequence-wise statistics for the input term (Cooijmans
# sec. 5.4), per-step ones for the recurrent term and the cell.
VARIANT_SPECS['bn_lstm_sequence_input'] = dict(cell='lstm', recurrent='batch', input='batch',
                                               cell_site='batch', input_stats='sequence')


def _batch_norm_rows(z, valid, scale, shift, eps=1e-5):
  """BN of `z [N, F]` with the moments of its valid rows."""
  mean, var, _ = masked_moments(z, valid)
  return normalize(z, mean, var, scale, shift, eps)


def attentive_reader(params, document, document_mask, query, query_mask, candidates, *,
                     layer_variant, bidirectional, attention_norm):
  """Logits `[B, E]` and attention `[B, T]` of the Attentive Reader (Hermann et al. 2015,
  Cooijmans sec. 5.4) in training mode, float64, step by step.

    y_d(t), u from the encoders (u = last valid h; bidirectional: [forward, backward],
    the backward layer run on each sequence's reversed valid part);
    m(t) = tanh(N(W_ym y_d(t)) + N(W_um u)); s = softmax over valid t of w^T m(t);
    r = sum_t s(t) y_d(t); g = tanh(N(W_rg r) + N(W_ug u)); logits = W g + b, entities
    that are not candidates excluded (returned as -inf).
  attention_norm None (N = identity) or 'sequence' (W_ym y_d normalised over the valid
  (b, t) entries, the `[B, F]` terms over the batch), each N with its own scale, shift.
  `params` is the model's parameter tree (names as the library's).
  """
  emb = np.asarray(params['embed']['embedding'], np.float64)
  def encode(name, tokens, mask):
    x = emb[tokens] * mask[..., None]
    if not bidirectional:
      carry, out, _ = run_layer(params[name]['layer_0'], x, mask, layer_variant)
      return out, carry[1]
    # A bidirectional stack's layer holds its forward and backward layers.
    forward, backward = (params[name]['layer_0'][d] for d in ('forward_layer', 'backward_layer'))
    carry_f, out_f, _ = run_layer(forward, x, mask, layer_variant)
    carry_b, out_b, _ = run_layer(backward, reverse_each(x, mask), mask, layer_variant)
    return (np.concatenate([out_f, reverse_each(out_b, mask)], -1),
            np.concatenate([carry_f[1], carry_b[1]], -1))
  y_d, _ = encode('document_encoder', document, document_mask)
  _, u = encode('query_encoder', query, query_mask)
  batch, time, width = y_d.shape
  valid = document_mask > 0
  def norm(name, z, rows_valid):
    if attention_norm is None:
      return z
    p = params[name]
    return _batch_norm_rows(z, rows_valid, p['scale'], p['bias'])
  kernel = lambda name: np.asarray(params[name]['kernel'], np.float64)
  y_m = norm('document_attention_norm', y_d.reshape(-1, width) @ kernel('document_attention'),
             valid.reshape(-1)).reshape(batch, time, -1)
  all_rows = np.ones(batch, bool)
  u_m = norm('query_attention_norm', u @ kernel('query_attention'), all_rows)
  m = np.tanh(y_m + u_m[:, None, :])
  scores = (m @ kernel('attention_score'))[..., 0]
  attention = np.zeros((batch, time))
  for b in range(batch):
    n = int(valid[b].sum())
    e = np.exp(scores[b, :n] - scores[b, :n].max())
    attention[b, :n] = e / e.sum()
  r = np.einsum('bt,btd->bd', attention, y_d)
  g = np.tanh(norm('read_combination_norm', r @ kernel('read_combination'), all_rows)
              + norm('query_combination_norm', u @ kernel('query_combination'), all_rows))
  logits = g @ kernel('output') + np.asarray(params['output']['bias'], np.float64)
  return np.where(candidates > 0, logits, -np.inf), attention
