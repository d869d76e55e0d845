"""Not the fedrun package: the clone's own folder. It is imported only when the folder holding a clone named
``fedrun`` is on ``sys.path`` (a script beside the clone does ``import fedrun``). Without this file Python
would take the clone's folder for a namespace package named fedrun, empty (``module 'fedrun' has no
attribute 'run'``), ahead of the installed package; with it, ``import fedrun`` gets the package in
``fedrun/`` of this clone, the same files an editable install of the clone points at.
"""

import importlib.util
import os
import sys

if __name__ == "fedrun":  # imported as the package's name: load the package in place of this file
    _package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fedrun", "__init__.py")
    if not os.path.isfile(_package):
        raise ImportError(f"{os.path.dirname(_package)}: a folder named fedrun without the fedrun package in it; "
                          "rename the folder, or run the script from another folder")
    _spec = importlib.util.spec_from_file_location(
        "fedrun", _package, submodule_search_locations=[os.path.dirname(_package)])
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["fedrun"] = _module  # the import statement returns what sys.modules holds after this file ran
    _spec.loader.exec_module(_module)
