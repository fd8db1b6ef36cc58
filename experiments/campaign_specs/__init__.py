"""Campaign specs: one module per paper table or figure set, `get_campaign() -> Campaign`.

Each module's docstring opens with its commands and expected cost, in the manner of
big_vision's configs; `python -m experiments.campaign list` prints them all.
"""

NAMES = (
    'quickstart',
    'init_options',
    'mnist_fig2',
    'pmnist_fig2',
    'ptb_char_256',
    'ptb_char_256_lengths',
    'ptb_char_1000',
    'ptb_char_1000_lengths',
    'ptb_word_small',
    'brown_tagger',
    'attentive_reader_long',
    'attentive_reader_1200',
    'attentive_reader_200',
)

#: Campaigns whose runs are still training: no results JSON yet (`collect` writes it once
#: every run has finished), so no quoted table.
IN_PROGRESS = ()
