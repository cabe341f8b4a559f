"""transformers' Llama 4 image processor without torchvision: ``Llama4ImageProcessor`` (transformers 5.23.0 ships no
PIL backend for it) with its three torchvision calls done by the torch code torchvision runs for them. Imported by
the reader and the tests only (torch, transformers).

Everything else is transformers' own code, run as it is: the canvas (``find_supported_resolutions``,
``get_best_fit``), the resize without distortion, the padding to the canvas, the rescale and normalize in bfloat16
(the original implementation's, which its ``rescale_and_normalize`` keeps), the split into tiles, the global tile.
The three calls, transliterated from torchvision 0.2x's ``transforms.v2.functional`` (``resize_image``,
``pad_image``, ``normalize_image``):

- resize: ``F.interpolate`` bilinear, ``align_corners=False``, antialiased. A uint8 image goes in as uint8 when the
  CPU has AVX2 or AVX-512 (torch's native uint8 kernel, ``_do_native_uint8_resize_on_cpu``), else as float32, rounded
  back to uint8; a (1, C, H, W) channels-last input is restrided as torchvision does (it picks the kernel's memory
  format). So, as with torchvision itself, the pixels depend on the CPU's vector extensions, never on packer;
- pad: zeros at the right and bottom (``fill`` [0, 0, 0] is ``_pad_with_vector_fill`` over a zero constant pad);
- normalize: ``(image - mean) / std`` with mean and std as tensors of the image's dtype (bfloat16 here).

``transformers.models.llama4.image_processing_llama4`` imports ``torchvision.transforms.v2.functional`` at module
level; where torchvision is missing, ``_llama4_module`` imports it with a stand-in module holding those functions in
``sys.modules`` for the duration of that one import (the module keeps the stand-in as its ``tvF``: its
``pad_to_best_fit`` calls ``tvF.pad``). Nothing else sees the stand-in.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from packer.errors import ConfigError

_INTEGER = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_MODULE = "transformers.models.llama4.image_processing_llama4"
_STANDIN = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional")
_LOCK = threading.Lock()


def _native_uint8(mode: str, device: torch.device) -> bool:
    """torchvision's ``_do_native_uint8_resize_on_cpu`` (and its CPU-only condition)."""
    if device.type != "cpu":
        return False
    if mode == "bilinear":
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return mode == "bicubic"


def resize_image(image: torch.Tensor, size: tuple[int, int], mode: str = "bilinear", antialias: bool = True) -> torch.Tensor:
    """torchvision.transforms.v2.functional.resize_image for (..., C, H, W) to (height, width) = ``size``."""
    shape = image.shape
    numel = image.numel()
    channels, old_h, old_w = shape[-3:]
    new_h, new_w = size
    if (new_h, new_w) == (old_h, old_w):
        return image
    if numel > 0:
        dtype = image.dtype
        acceptable = [torch.float32, torch.float64] + ([torch.uint8] if _native_uint8(mode, image.device) else [])
        image = image.reshape(-1, channels, old_h, old_w)
        strides = image.stride()
        if image.is_contiguous(memory_format=torch.channels_last) and image.shape[0] == 1 and numel != strides[0]:
            image = image.as_strided((1, channels, old_h, old_w), [numel, *strides[1:]])
        cast = dtype not in acceptable
        if cast:
            image = image.to(dtype=torch.float32)
        image = F.interpolate(image, size=[new_h, new_w], mode=mode, align_corners=False, antialias=antialias)
        if cast:
            if mode == "bicubic" and dtype == torch.uint8:
                image = image.clamp_(min=0, max=255)
            if dtype in _INTEGER:
                image = image.round_()
            image = image.to(dtype=dtype)
    return image.reshape(shape[:-3] + (channels, new_h, new_w))


def pad_image(image: torch.Tensor, padding: list[int], fill: Any = None, padding_mode: str = "constant") -> torch.Tensor:
    """torchvision.transforms.v2.functional.pad_image, constant mode with a zero fill (scalar or per channel) only:
    ``padding`` [left, top, right, bottom]."""
    fills = [fill] if fill is None or isinstance(fill, int | float) else list(fill)
    if padding_mode != "constant" or any(f not in (None, 0) for f in fills) or len(padding) != 4:
        raise ConfigError(f"the Llama 4 reader pads with zeros at the right and bottom only, got {padding} {fill} "
                          f"{padding_mode}")
    left, top, right, bottom = padding
    return F.pad(image, [left, right, top, bottom], mode="constant", value=0.0)


def normalize_image(image: torch.Tensor, mean: Any, std: Any, inplace: bool = False) -> torch.Tensor:
    """torchvision.transforms.v2.functional.normalize_image: mean and std in the image's dtype, sub then div."""
    mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device)
    std = torch.as_tensor(std, dtype=image.dtype, device=image.device)
    if mean.ndim == 1:
        mean = mean.view(-1, 1, 1)
    if std.ndim == 1:
        std = std.view(-1, 1, 1)
    image = image.sub_(mean) if inplace else image.sub(mean)
    return image.div_(std)


def _standin() -> dict[str, types.ModuleType]:
    """The four torchvision modules ``image_processing_llama4`` imports through, the last holding the functions above."""
    mods = {}
    for name in _STANDIN:
        mods[name] = types.ModuleType(name)
        mods[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    functional = mods["torchvision.transforms.v2.functional"]
    functional.pad, functional.normalize = pad_image, normalize_image
    functional.resize = lambda image, size, interpolation=None, antialias=True: resize_image(image, tuple(size))
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    mods["torchvision.transforms"].v2 = mods["torchvision.transforms.v2"]
    mods["torchvision.transforms.v2"].functional = functional
    return mods


@lru_cache(maxsize=1)
def _llama4_module() -> types.ModuleType:
    """``transformers.models.llama4.image_processing_llama4``, imported with the stand-in where torchvision is missing."""
    from transformers.utils import is_torchvision_available

    if _MODULE in sys.modules or is_torchvision_available():  # evaluated (and cached) before any stand-in exists
        return importlib.import_module(_MODULE)
    importlib.import_module("transformers.image_processing_backends")  # what it imports, loaded without the stand-in
    importlib.import_module("transformers.image_transforms")
    with _LOCK:
        if any(name in sys.modules for name in _STANDIN):
            raise ConfigError("a partial torchvision is imported; cannot load Llama 4's image processor")
        sys.modules.update(_standin())
        try:
            return importlib.import_module(_MODULE)
        finally:
            for name in _STANDIN:
                sys.modules.pop(name, None)


@lru_cache(maxsize=1)
def image_processor_class() -> type:
    """transformers' ``Llama4ImageProcessor`` with its resize and normalize done in torch (see the module docstring)."""
    module = _llama4_module()

    class Llama4ImageProcessorTorch(module.Llama4ImageProcessor):
        def resize(self, image, size, resample=None, antialias=True, **kwargs):
            mode = {None: "bilinear", 2: "bilinear", 3: "bicubic"}.get(None if resample is None else int(resample))
            if mode is None:
                raise ConfigError(f"the Llama 4 reader resizes bilinear or bicubic, got resample={resample!r}")
            return resize_image(image, (size.height, size.width), mode=mode, antialias=antialias)

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            return normalize_image(image, mean, std, inplace=inplace)

    return Llama4ImageProcessorTorch
