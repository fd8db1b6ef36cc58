"""Scripts that redraw the papers' figures; run from the repository root as modules.

  python -m experiments.analysis.gradient_flow      # Cooijmans Fig. 1(a)
  python -m experiments.analysis.tanh_derivative    # Cooijmans Fig. 1(b)
  python -m experiments.analysis.population_stats   # Cooijmans Fig. 5
  python -m experiments.analysis.gamma_sensitivity  # Cooijmans Fig. 6
  python -m experiments.analysis.laurent_appendix   # Laurent et al. appendix A
  python -m experiments.analysis.estimate_batch_size  # population estimate, 784-step MNIST
  python -m experiments.analysis.estimate_trained --et_workdir=RUN  # a trained run's estimate
  python -m experiments.analysis.estimate_spread --es_workdir=RUN   # where its draws differ
  python -m experiments.analysis.running_average_gap --rg_workdir=RUN  # where its running
                                                    # average loses
  python -m experiments.analysis.running_average_lag --lag_workdir=RUN  # whether it lags

Shared flags (`common.py`): --output_dir (default experiments/results/figures),
--mnist_dir, --ptb_dir (default mnist/ and ptb/ under $BN_RNN_JAX_DATA), --gammas, --seed,
--paper_scale.
Each writes `<name>.png` and `<name>.json` (the plotted numbers) and runs in minutes on a
2-core CPU by default.
"""
