"""gorun.torch: training a PyTorch module on gorun's plan and executor.

    import gorun.torch
    model = gorun.torch.distribute(model, mode="ddp")
    loss = model(x); loss.backward(); opt.step()

The plan comes from the model itself (regions are module paths, members are
its parameters, tied ones once, costs measured on the first step) and runs
on gorun's executor in Go through libgorun's C ABI. Run the program under
gorun: ``gorun -np 4 python3 train.py``.
"""

from ._abi import PlanMismatchError
from ._model import MODES, DistributedModel, distribute

__all__ = ["MODES", "DistributedModel", "PlanMismatchError", "distribute"]
