"""A small plugin package for fedrun, outside the fedrun package (docs/extending.md).

* ``myfl.algorithm:ClippedFedAvg``: FedAvg whose client deltas are clipped to a norm before averaging;
* ``myfl.model:mlp``: a two-layer perceptron factory ``(input_shape, num_classes, settings) -> nn.Module``
  with its own setting ``model.width``;
* ``myfl.data:blobs``: Gaussian blobs, one natural client group per writer-like cluster;
* ``myfl.participation:NoRepeat``: S clients per round, none of them active in the last
  ``participation.cooldown`` rounds (a pattern with state that the checkpoint saves, and its own setting);
* ``myfl.npz_clients:NpzClients``: a dataset format read per client on demand (a ``ClientSource``);
* ``myfl.csv_sink:CsvSink``: a metrics sink writing every round's record as a row of ``rounds.csv``.

Put ``examples/`` on the Python path (``PYTHONPATH=examples``) and name them in a config.
"""
