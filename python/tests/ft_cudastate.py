"""Preloaded by test_ft_forkserver.py's fork server: leaves torch's CUDA
state marked initialised, as torch.cuda's lazy initialisation does, on a
machine without a GPU (torch.cuda.is_initialized() then says True)."""

import torch.cuda

torch.cuda._initialized = True
