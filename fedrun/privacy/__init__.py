"""Differential privacy as an aggregation concern (docs/privacy.md): the ``privacy`` config section
(``config.py``), the clipping and Gaussian noise around the exchange (``mechanism.py``), the accountant
under the run's participation pattern (``accountant.py``) and what the guarantee is about (``guarantee.py``);
DP-FTRL's banded correlated noise and its accountant (``bandmf.py``). The algorithm never knows about it.

This package's ``__init__`` imports nothing, so that reading a config (which imports ``config.py``) loads
neither torch nor dp-accounting.
"""
