"""The two pieces of TRL's asynchronous trainer that only run on CUDA, replaced for CPU runs (tests, the tiny
world).

`trl.experimental.async_grpo` packs each micro-batch into a prefix tree and runs attention with a
flash-attention kernel fetched from the hub (``kernels``), and its constructor asks ``torch.cuda`` for the
device's peak FLOPs. `install_cpu_shims` swaps in a per-segment ``scaled_dot_product_attention`` with the
kernel's bottom-right causal alignment, and a FLOPs probe that returns ``None`` off CUDA (which only turns off
TRL's MFU metrics). It does nothing when a GPU is present, so GPU runs use TRL's kernel unchanged.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float | None = None,
) -> torch.Tensor:
    """``flash_attn_varlen_func`` for plain causal attention: one SDPA per segment. ``q`` is ``(Nq, H, D)``,
    ``k`` / ``v`` ``(Nk, Hkv, D)`` (already gathered along each segment's root-to-segment path); a query
    attends to the keys up to its own position counted from the end (flash-attention's alignment when a
    segment has fewer queries than keys)."""
    if not causal or tuple(window_size) != (-1, -1) or softcap:
        raise NotImplementedError(
            "the CPU attention for packed rows covers plain causal attention only (no sliding window, "
            "no softcap)"
        )
    out = q.new_empty(q.shape)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device).tril(
            diagonal=(k1 - k0) - (q1 - q0)
        )
        segment = F.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1),
            k[k0:k1].transpose(0, 1),
            v[k0:k1].transpose(0, 1),
            attn_mask=mask,
            scale=softmax_scale,
            enable_gqa=True,
        )
        out[q0:q1] = segment.transpose(0, 1)
    return out


_KERNEL = types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


def install_cpu_shims(force: bool = False) -> bool:
    """Replace the CUDA-only attention kernel and FLOPs probe of TRL's async trainer when no GPU is available
    (or, with ``force``, also on a GPU: the SDPA attention needs no kernel from the hub). Idempotent; returns
    whether the shims are (now) installed."""
    if torch.cuda.is_available() and not force:
        return False
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    packing._flash_attn = lambda: _KERNEL  # tree_attention looks the kernel up by this name at every call
    probe = async_grpo_trainer.get_peak_flops_per_device
    if not getattr(probe, "_rgpo_cpu_shim", False):

        def peak_flops_off_cuda(accelerator, dtype):
            return probe(accelerator, dtype) if accelerator.device.type == "cuda" else None

        peak_flops_off_cuda._rgpo_cpu_shim = True
        async_grpo_trainer.get_peak_flops_per_device = peak_flops_off_cuda
    return True
