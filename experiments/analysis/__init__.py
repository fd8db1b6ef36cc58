"""The analyses: each script here is a command line (`python -m experiments.analysis.NAME
--help`) whose flags are the arguments of the library function it runs; the libraries
are in `lib/` (no flags), the questions of the variable-length study in
`experiments/question_specs/`. Each analysis writes a JSON that names its kind (and
most a PNG) under experiments/results/ (figures/ for the papers' figures), and prints
what its kind renders."""
