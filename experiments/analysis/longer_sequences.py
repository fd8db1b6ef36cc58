r"""Population statistics for sequences longer than training, made several ways from the
same parameters and batches. About 40 minutes on 2 CPU cores.

  python -m experiments.analysis.longer_sequences [--steps=1000] [--seeds=5]

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.length_studies.longer_sequences`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import length_studies

if __name__ == '__main__':
  cli.main(length_studies.longer_sequences)
