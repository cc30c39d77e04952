"""Start-up shim of the CPU SGLang server (docs/sglang-cpu.md).

Python imports `sitecustomize` at start-up from any directory on `PYTHONPATH`; the
launcher (`backend_plugin.cpu_server.serve`) puts this directory there for the server
and every scheduler process it spawns, and nowhere else. It registers the torchvision
operator schemas a CPU-only torch lacks before SGLang imports torchvision: see
`backend_plugin/cpu_server/torchvision_shim.py` for why.
"""

try:
    from backend_plugin.cpu_server.torchvision_shim import register
except ImportError:  # not the SGLang environment: nothing to do
    pass
else:
    register()
