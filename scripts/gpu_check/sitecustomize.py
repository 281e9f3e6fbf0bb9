# Device-only shim (not part of monarch_nb): the image's torch 2.11 lacks names torchtitan 0.3.0
# imports for type annotations of FSDP mesh dims (torch >= 2.13). A placeholder lets the modules
# import; FSDP inside a group (group_size > 1) is not used by this check.
try:
    import torch.distributed.fsdp as _fsdp
    if not hasattr(_fsdp, "DataParallelMeshDims"):
        class DataParallelMeshDims:  # noqa: D401
            def __init__(self, *a, **k):
                raise RuntimeError("DataParallelMeshDims needs torch >= 2.13")
        _fsdp.DataParallelMeshDims = DataParallelMeshDims
except Exception:
    pass
