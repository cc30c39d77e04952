"""Register the two torchvision operator schemas a CPU-only torch lacks (SGLANG-NOTES).

The torchvision 0.28.0 wheel on PyPI is built against CUDA torch. Beside the CPU build
of torch 2.13.0 its C extension does not load, so the `torchvision::nms` and
`torchvision::qnms` schemas that `torchvision/_meta_registrations.py` decorates at import
are missing and `import torchvision` (pulled in by transformers' model and image
modules, which SGLang imports) raises "operator torchvision::nms does not exist".
Defining the schemas first lets the import succeed; neither operator is ever called for
a text model. Used by the CPU server's `sitecustomize`, the tiny-model builder and the
SGLang class tests.
"""

from __future__ import annotations

_library = None  # kept alive: dropping the Library object would unregister the schemas


def register() -> None:
    """Define `torchvision::nms` and `torchvision::qnms` once per process."""
    global _library
    if _library is not None:
        return
    import torch

    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _library = library
