"""Tensors across the torch-free core: parameters as host memory (address, dtype, shape), flat fp32
values as (address, count) or bytes. The core links no libtorch, so the checks a tensor needs
(its type, dtype, layout, device, whether it is still the module's) are made here, in Python's
words, before the core is called."""

import warnings

import torch

from ._core import FailedPreconditionError, InvalidArgumentError

_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
           torch.float16: "float16"}


def named_parameters(model, what):
    """[(name, tensor)] of a module (all of named_parameters()) or of a list of pairs."""
    if isinstance(model, torch.nn.Module):
        return list(model.named_parameters())
    if isinstance(model, (str, bytes)) or not hasattr(model, "__iter__"):
        raise TypeError(f"{what} must be a torch.nn.Module or a list of (name, tensor) pairs, "
                        f"got {type(model).__name__}")
    pairs = []
    for item in model:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"{what}: each item must be a (name, tensor) pair, got "
                            f"{type(item).__name__}")
        pairs.append(item)
    return pairs


def _check_tensor(name, t):
    if t.dtype not in _DTYPES:
        raise InvalidArgumentError(
            f"parameter '{name}' is {t.dtype}: parameters are float32, bfloat16, float16 or "
            "float64")
    if not t.is_contiguous():
        raise InvalidArgumentError(f"parameter '{name}' is not contiguous (atoll reads and writes "
                                   "its memory in place): make it .contiguous() before joining")
    if t.device.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"parameter '{name}' is on {t.device}: atoll syncs CPU and "
                                   "CUDA tensors")


class HostParams:
    """A module's parameters as the core reads and writes them: CPU tensors in place, a CUDA
    tensor through a host mirror copied before the core reads it and after it writes it. Holds
    every tensor it hands the core, so that their memory lives as long as the island."""

    def __init__(self, pairs, module=None):
        self.module = module
        self.names = [n for n, _ in pairs]
        self.tensors = [t for _, t in pairs]
        seen = {}
        for name, t in pairs:
            _check_tensor(name, t)
            if t.numel() > 0:
                other = seen.setdefault(t.data_ptr(), name)
                if other != name:
                    raise InvalidArgumentError(
                        f"parameters '{other}' and '{name}' are one tensor (tied weights): give "
                        "the island each tensor once")
        self.addresses = [t.data_ptr() for t in self.tensors]
        pinned = torch.cuda.is_available()
        self.mirrors = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pinned)
                        if self.mirrored(t) else None for t in self.tensors]
        if module is not None:
            _warn_unsynced_buffers(module)

    @staticmethod
    def mirrored(t):
        """Whether the core reaches `t` through a host mirror (not in its own memory)."""
        return t.device.type != "cpu"

    def specs(self):
        """(name, host address, dtype, shape) per parameter, for the core."""
        out = []
        for name, t, m in zip(self.names, self.tensors, self.mirrors):
            host = t if m is None else m
            out.append((name, host.data_ptr(), _DTYPES[t.dtype], list(t.shape)))
        return out

    def mirror_copies(self):
        """The core's (to_host, from_host) callbacks, or None when every tensor is on the CPU."""
        if all(m is None for m in self.mirrors):
            return None

        def to_host(indices):
            for i in indices:
                if self.mirrors[i] is not None:
                    self.mirrors[i].copy_(self.tensors[i].detach())

        def from_host(indices):
            with torch.no_grad():
                for i in indices:
                    if self.mirrors[i] is not None:
                        self.tensors[i].copy_(self.mirrors[i])

        return to_host, from_host

    def check_unchanged(self):
        """Before each step: the module still holds the tensors the island joined with, in the
        memory it joined with (a replaced parameter would silently stop being synced)."""
        current = self.module.named_parameters() if self.module is not None else zip(
            self.names, self.tensors)
        for (name, p), t, address in zip(current, self.tensors, self.addresses):
            if p is not t or p.data_ptr() != address:
                raise FailedPreconditionError(
                    f"parameter '{name}' is no longer the tensor the island joined with (replaced, "
                    "e.g. by load_state_dict(assign=True) or by setting .data): atoll reads and "
                    "writes the tensors it joined with; copy new values into them "
                    "(load_state_dict without assign), or join again")


def _warn_unsynced_buffers(module):
    # Persistent buffers are state (a state_dict holds them); others are derived (rotary
    # frequencies) and every island computes the same.
    persistent = set(module.state_dict(keep_vars=True))
    floating = [n for n, b in module.named_buffers() if b.is_floating_point() and n in persistent]
    if floating:
        shown = ", ".join(floating[:5]) + (f" and {len(floating) - 5} more" if len(floating) > 5 else "")
        warnings.warn(
            f"the module's floating-point buffers ({shown}) are not synced: each island keeps its "
            "own (e.g. BatchNorm's running statistics), so islands with equal hashes may evaluate "
            "differently", stacklevel=4)


def flat_floats(t, what):
    """(the fp32 CPU tensor kept alive, (address, count)) for the core to read."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
        raise InvalidArgumentError(f"{what} must hold numbers, got a {t.dtype} tensor")
    flat = t.detach().to("cpu", torch.float32).contiguous().view(-1)
    return flat, (flat.data_ptr(), flat.numel())


def tensor_of(data):
    """A flat fp32 tensor from the core's bytes (a copy)."""
    if len(data) == 0:
        return torch.empty(0, dtype=torch.float32)
    return torch.frombuffer(bytearray(data), dtype=torch.float32)
