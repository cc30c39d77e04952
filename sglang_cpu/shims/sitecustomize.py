"""Start-up shim of the CPU SGLang server (docs/sglang-cpu.md).

Python imports `sitecustomize` at start-up from any directory on `PYTHONPATH`; the
launcher (`sglang_cpu.serve`) puts this directory there for the server
and every scheduler process it spawns, and nowhere else. It registers the torchvision
operator schemas a CPU-only torch lacks before SGLang imports torchvision: see
`sglang_cpu/torchvision_shim.py` for why.
"""

try:
    from sglang_cpu.torchvision_shim import register
except ImportError:  # not the SGLang environment: nothing to do
    pass
else:
    register()


def _quiet_model_registry() -> None:
    """SGLang imports every model architecture it has when it starts, and each that needs
    a GPU kernel absent on this CPU logs "Ignore import error when loading ..." (about
    forty lines over its processes, which read like failures). Only the served model
    matters: keep the first such line of each process, reworded to say so, and drop
    the rest. SGLang's code and its other messages are untouched."""
    import logging

    class _Once(logging.Filter):
        seen = False

        def filter(self, record: logging.LogRecord) -> bool:
            if not str(record.msg).startswith("Ignore import error when loading"):
                return True
            if self.seen:
                return False
            self.seen = True
            record.msg = (
                "model architectures that need kernels absent on this CPU are skipped "
                "(harmless: only the served model is loaded; further lines hidden)"
            )
            record.args = ()
            return True

    once = _Once()
    for name in ("sglang.srt.models.registry", "sglang.srt.managers.multimodal_processor"):
        logging.getLogger(name).addFilter(once)


_quiet_model_registry()
