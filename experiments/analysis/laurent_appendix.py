r"""Laurent et al. 2016, appendix A: batch norm inside a tanh RNN's recurrence against
batch norm of its input term only, on character PTB.

  python -m experiments.analysis.laurent_appendix [--variants=rnn,rnn_bn_input:1.0]

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.recurrence_figures.laurent_appendix`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import recurrence_figures

if __name__ == '__main__':
  cli.main(recurrence_figures.laurent_appendix)
