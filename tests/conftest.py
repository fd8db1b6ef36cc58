"""Test session setup: 8 fake CPU devices, set before JAX is imported anywhere.

Multi-device code (pmap over axis 'batch') is tested on these; single-device code runs
on device 0 as usual.
"""

import os

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
