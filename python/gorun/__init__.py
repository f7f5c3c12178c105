"""gorun for PyTorch: the torch.distributed backend "gorun" on gorun's
collective runtime (libgorun, loaded with ctypes; no C++ extension).

    import gorun                      # registers the backend
    dist.init_process_group("gorun")  # env://, tcp://, file://; or "cpu:gorun,cuda:nccl"

Run the program under gorun (``gorun -np 4 python train.py``), torchrun or
mp.spawn, with a Python that has torch 2.x. See python/README.md for what is
supported.
"""

from ._lib import GorunError, GorunTimeout, library_path
from .backend import BACKEND, GorunBackend, Options, ProcessGroupGorun, finalize, register

register()

__all__ = ["BACKEND", "GorunBackend", "GorunError", "GorunTimeout", "Options", "ProcessGroupGorun", "finalize",
           "library_path", "register"]
