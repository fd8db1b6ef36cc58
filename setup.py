"""bn_rnn_jax: batch-normalised recurrent networks (Cooijmans et al. 2016, Laurent et al. 2016)."""

from setuptools import find_packages, setup

EXTRAS = {
    # The trainer, its configs, checkpoints and event files (bn_rnn_jax.training, experiments/).
    'train': ['optax>=0.2.8', 'orbax-checkpoint>=0.12.8', 'absl-py', 'ml_collections',
              'tensorboardX'],
    'data': ['tensorflow-datasets>=4.9.10', 'array_record', 'scikit-learn', 'kaldiio'],
    'export': ['flatbuffers'],
    'plot': ['matplotlib'],
    # The viewer of the event files every run writes (<workdir>/tensorboard, written
    # with tensorboardX, which needs no TensorFlow): `tensorboard --logdir <workdir>`.
    'tensorboard': ['tensorboard>=2.21'],
    'test': ['pytest', 'nbclient', 'nbformat', 'ipykernel'],
    'docs': ['sphinx>=9.0', 'myst-parser>=5.0', 'furo'],
}
# Everything above: the experiments, their data, tests and docs.
EXTRAS['all'] = sorted({r for extra in EXTRAS.values() for r in extra})

setup(
    name='bn_rnn_jax',
    version='0.2.0',
    description='Recurrent batch normalization (BN-LSTM) in JAX/Flax',
    packages=find_packages(include=['bn_rnn_jax', 'bn_rnn_jax.*']),
    python_requires='>=3.10',
    # The layers, cells and models (`import bn_rnn_jax`, `make_layer`, `BNLSTMCell`, ...).
    install_requires=['jax>=0.10.2', 'jaxlib>=0.10.2', 'flax>=0.12.8', 'numpy'],
    extras_require=EXTRAS,
)
