"""HDF5 files read from their bytes, the way HDF5 reads them: the superblock and object headers
(``headers.py``), a group's links (``groups.py``), one parse applied to many objects at once (``templates.py``)
and HDF5's metadata checksum (``checksum.py``). Imports nothing of fedrun but its errors, so that reading a
config (fedrun/config/client_count.py) and the data (fedrun/data/federated_h5_index.py) both list a file's
clients without handing HDF5 a damaged group."""
