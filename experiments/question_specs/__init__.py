"""Question specs of the `variable_length_cause` study: one module per question,
`get_question() -> length_cause.Question` (its arms, beside the same LSTM), whose answer
is `experiments/results/<module name>.json`. Each module's docstring opens with its
command; `python -m experiments.analysis.variable_length_cause --question=NAME` runs one.
"""
