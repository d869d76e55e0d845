"""A small plugin package for fedrun, outside the fedrun package (docs/extending.md).

* ``myfl.algorithm:ClippedFedAvg``: FedAvg whose client deltas are clipped to a norm before averaging;
* ``myfl.model:mlp``: a two-layer perceptron factory ``(input_shape, num_classes) -> nn.Module``;
* ``myfl.data:blobs``: Gaussian blobs, one natural client group per writer-like cluster;
* ``myfl.participation:NoRepeat``: S clients per round, none of them active in the round before
  (a pattern with state that the checkpoint saves).

Put ``examples/`` on the Python path (``PYTHONPATH=examples``) and name them in a config.
"""
