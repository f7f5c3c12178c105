"""gorun for PyTorch: the torch.distributed backend "gorun" on gorun's
collective runtime (libgorun, loaded with ctypes; no C++ extension).

    import gorun                      # registers the backend
    dist.init_process_group("gorun")  # env:// (gorun, torchrun) or a store

Run the program under gorun (``gorun -np 4 /usr/bin/python3 train.py``) with
the python3 that has torch. See python/README.md for what is supported.
"""

from ._lib import GorunError, GorunTimeout, library_path
from .backend import BACKEND, GorunBackend, Options, ProcessGroupGorun, finalize, register

register()

__all__ = ["BACKEND", "GorunBackend", "GorunError", "GorunTimeout", "Options", "ProcessGroupGorun", "finalize",
           "library_path", "register"]
