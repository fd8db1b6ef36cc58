r"""The estimate's variances averaged (the papers') or pooled, from thin batches and from
training batches. About 7 minutes on 2 CPU cores.

  python -m experiments.analysis.pooled_variance [--steps=1000] [--seeds=5]

Its flags (`--help`) are the arguments of
`experiments.analysis.lib.pooled_variance.pooled_variance`.
"""

from experiments.analysis.lib import cli
from experiments.analysis.lib import pooled_variance

if __name__ == '__main__':
  cli.main(pooled_variance.pooled_variance)
