"""`metric_writer.py`: `metrics.jsonl` written and read back, truncated on resume (a
partial last line skipped, a missing file a warning), bad lines one-line errors, and the
training-metric window and progress of the loop."""

import json
import logging
import os

import numpy as np
import pytest

from bn_rnn_jax.training import metric_writer


def _metrics_file(tmp_path, text):
  path = tmp_path / 'metrics.jsonl'
  path.write_text(text)
  return str(tmp_path)


def _lines(tmp_path):
  return [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]


def test_written_records_read_back_with_tensorboard_events(tmp_path):
  writer = metric_writer.MetricWriter(str(tmp_path))
  try:
    writer.write(3, 'train', {'loss': np.float32(1.5), 'accuracy': 0.25})
    writer.write(3, 'valid', {'loss': 2.0}, checkpoint_step=2)
  finally:
    writer.close()
  assert metric_writer.read_metrics(str(tmp_path)) == [
      {'step': 3, 'split': 'train', 'loss': 1.5, 'accuracy': 0.25},
      {'step': 3, 'split': 'valid', 'loss': 2.0, 'checkpoint_step': 2}]
  events = os.listdir(tmp_path / 'tensorboard')
  assert any(name.startswith('events.out.tfevents') for name in events)


def test_a_disabled_writer_writes_nothing(tmp_path):
  writer = metric_writer.MetricWriter(str(tmp_path), enabled=False)
  writer.write(1, 'train', {'loss': 1.0})
  writer.truncate(1)
  writer.close()
  assert os.listdir(tmp_path) == []


def test_truncate_drops_the_records_after_the_resumed_step(tmp_path):
  records = [{'step': 2, 'split': 'train'}, {'step': 4, 'split': 'train'},
             {'step': 4, 'split': 'valid'}, {'step': 4, 'split': 'test'},
             {'step': 6, 'split': 'train'}]
  _metrics_file(tmp_path, ''.join(json.dumps(r) + '\n' for r in records))
  writer = metric_writer.MetricWriter(str(tmp_path))
  try:
    writer.truncate(4, retest=False)
    # A longer run resuming from step 4: the earlier launch's end-of-run test stays.
    assert _lines(tmp_path) == records[:4]
    writer.truncate(4)
  finally:
    writer.close()
  # The records of step 4 were written before its checkpoint, except the end-of-run test
  # record, which follows the last checkpoint and is redone by a launch ending there.
  assert _lines(tmp_path) == records[:3]


def test_records_dropped_by_a_start_from_step_0_are_a_warning(tmp_path, caplog):
  """The run's checkpoints are gone: it starts again from step 0 over the old records."""
  records = [{'step': 3, 'split': 'train'}, {'step': 3, 'split': 'valid'},
             {'step': 6, 'split': 'train'}]
  _metrics_file(tmp_path, ''.join(json.dumps(r) + '\n' for r in records))
  writer = metric_writer.MetricWriter(str(tmp_path))
  try:
    with caplog.at_level(logging.WARNING):
      writer.truncate(3)         # a resume from step 3: the records after it are redone
      assert not caplog.text
      writer.truncate(0)
  finally:
    writer.close()
  assert caplog.messages == [
      f'{tmp_path}/metrics.jsonl holds 2 records (steps 3 to 3) but the run starts from '
      'step 0 (no checkpoint to resume from): they are dropped.']
  assert (tmp_path / 'metrics.jsonl').read_text() == ''


def test_partial_last_line_is_skipped_with_a_warning(tmp_path, caplog):
  workdir = _metrics_file(tmp_path, '{"step": 1, "split": "train"}\n{"step": 2, "spl')
  with caplog.at_level(logging.WARNING):
    assert metric_writer.read_metrics(workdir) == [{'step': 1, 'split': 'train'}]
  assert 'skipped its partial last line 2' in caplog.text


@pytest.mark.parametrize('text, message', [
    ('{"step": 1, "split": "train"}\nnot json\n{"step": 2, "split": "train"}\n',
     r'metrics.jsonl line 2 is not a JSON record'),
    ('{"split": "train", "loss": 1.0}\n',
     r'metrics.jsonl line 1 is not a metrics record \(needs an integer "step"'),
])
def test_bad_metrics_lines_are_one_clear_error(tmp_path, text, message):
  with pytest.raises(ValueError, match=message):
    metric_writer.read_metrics(_metrics_file(tmp_path, text))


def test_metrics_file_that_is_a_folder_is_one_clear_error(tmp_path):
  os.makedirs(tmp_path / 'metrics.jsonl')
  with pytest.raises(ValueError, match='metrics.jsonl is a directory'):
    metric_writer.read_metrics(str(tmp_path))


def test_deleted_metrics_file_on_resume_is_a_warning(tmp_path, caplog):
  writer = metric_writer.MetricWriter(str(tmp_path))
  try:
    with caplog.at_level(logging.WARNING):
      writer.truncate(0)        # a fresh run: nothing to say
      assert not caplog.text
      writer.truncate(40)       # resuming at step 40 without the file
  finally:
    writer.close()
  assert (f'{tmp_path}/metrics.jsonl is missing, but the run resumes from step 40: the '
          'metrics up to that step are gone') in caplog.text


def test_window_averages_the_steps_since_the_last_log_line():
  rng = np.random.default_rng(0)
  steps = [{'loss': float(a), 'accuracy': float(b)} for a, b in rng.uniform(size=(5, 2))]
  # A window checkpointed after two steps, restored and continued, logs the five steps'.
  window = metric_writer.MetricWindow({}, 0)
  for metrics in steps[:2]:
    window.add(metrics)
  restored = metric_writer.MetricWindow(window.sums, window.steps)
  for metrics in steps[2:]:
    restored.add(metrics)
  for name in ('loss', 'accuracy'):
    np.testing.assert_allclose(restored.means()[name], np.mean([m[name] for m in steps]),
                               rtol=1e-12)
  # The restored copy does not share the checkpointed sums.
  assert window.steps == 2 and window.sums == {k: steps[0][k] + steps[1][k] for k in steps[0]}
  restored.reset()
  assert (restored.sums, restored.steps) == ({}, 0)


def test_progress_counts_the_time_of_earlier_launches():
  progress = metric_writer.Progress(start=10, num_steps=20, previous_s=100.0)
  elapsed = progress.elapsed()
  assert 100.0 <= elapsed < 160.0
  progress.log(15)                   # a line with the rate and the ETA


def test_progress_measures_the_rate_after_start_up():
  """A launch that compiles for 30 s, then runs 10 steps/s: the first line gives the
  rate so far and no ETA; the next ones the rate since the first, without the start."""
  progress = metric_writer.Progress(start=100, num_steps=1100, previous_s=0.0)
  t0 = progress.t0
  rate, left = progress.rate(150, t0 + 35.0)     # 50 steps: 30 s compiling, then 5 s
  assert rate == pytest.approx(50 / 35) and left is None
  rate, left = progress.rate(250, t0 + 45.0)
  assert rate == pytest.approx(10.0) and left == pytest.approx(85.0)
  progress.log(350)                              # a line with the rate and the ETA
