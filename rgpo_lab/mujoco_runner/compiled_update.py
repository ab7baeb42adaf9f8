"""`--compile` for the four scripts: one mini-batch update as a single `torch.compile`d function.

The scripts' eager mini-batch step (`loss.backward()`, `clip_grad_norm_`, `torch.optim.Adam.step()`) is ~250
small ATen calls whose dispatch costs more than the step's matrix products at the paper's width
(results/benchmarks/mujoco_profile.md). Here the same step is one pure function, `torch.func.grad` of the
script's own mini-batch loss, then the gradient statistics, the global-norm clip and Adam written out as
torch computes them, that inductor fuses into a few kernels. Parameters and Adam moments are updated in place,
in the agent's parameters and in the `torch.optim.Adam` object's state, so rollouts, checkpoints and resume
are the same in both modes (a run may even be resumed in the other mode). Rounding differs from the eager
step (inductor fuses and reorders float operations): equal to float tolerance per step, not bit for bit.
Speed: results/benchmarks/mujoco_compile.md; learning outcomes over seeds: the grid suite compile_equiv, read
by rgpo_lab/benchmarks/compile_equivalence.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn as nn


class _LossModule(nn.Module):
    """`loss_fn(agent, *batch)` as a module, so `torch.func.functional_call` substitutes the agent's
    parameters for everything the loss reads (methods such as `agent.entropy()` included)."""

    def __init__(self, agent: nn.Module, loss_fn: Callable):
        super().__init__()
        self.agent = agent
        self.loss_fn = loss_fn

    def forward(self, *batch):
        return self.loss_fn(self.agent, *batch)


class CompiledAdamStep:
    """`step(*batch) -> (loss, aux, grad_sq)`: the same update as

        loss, aux = loss_fn(agent, *batch); optimizer.zero_grad(); loss.backward()
        g = cat(grads of stat_params); g_sum += g; grad_sq = g.dot(g)    # gradient-variance statistics
        clip_grad_norm_(params, max_grad_norm); optimizer.step()

    with `optimizer` a single-group `torch.optim.Adam` over `params` (no weight decay, amsgrad or maximize).
    `loss_fn` returns `(loss, aux)`; `aux` (a tensor, or tuples and dicts of tensors) comes back detached.
    Numbers that change between calls (learning rate, KL coefficient) must reach `loss_fn` as tensors in
    `batch`, never as Python floats, or every new value recompiles. `run(batches)` makes consecutive steps,
    several per compiled call.
    """

    def __init__(
        self,
        agent: nn.Module,
        optimizer: torch.optim.Adam,
        loss_fn: Callable,
        params: Sequence[nn.Parameter],
        max_grad_norm: float,
        stat_params: Sequence[nn.Parameter] = (),
        compile: bool = True,
        steps_per_call: int = 4,
    ):
        if steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}")
        (group,) = optimizer.param_groups
        if group["weight_decay"] or group["amsgrad"] or group["maximize"]:
            raise ValueError("CompiledAdamStep implements plain Adam (no weight_decay, amsgrad or maximize)")
        self.module = _LossModule(agent, loss_fn)
        by_id = {id(p): name for name, p in self.module.named_parameters()}
        self.params = list(params)
        self.names = [by_id[id(p)] for p in self.params]
        self.stat_names = [by_id[id(p)] for p in stat_params]
        # the group's hyperparameters are read from the optimiser, never kept: load_state_dict replaces the
        # group dicts (a cached one would miss the scripts' learning-rate annealing after a resume)
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.g_sum = torch.zeros(sum(p.numel() for p in stat_params))
        self.steps_per_call = steps_per_call
        self._steps = torch.compile(self._pure_steps, fullgraph=True) if compile else self._pure_steps

    def _state(self, p: nn.Parameter) -> dict:
        """The optimiser's own state for `p`, created as torch.optim.Adam creates it on its first step."""
        state = self.optimizer.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def __call__(self, *batch):
        """One update on `batch`."""
        return self._call([batch])[0]

    def run(self, batches: Sequence[tuple]) -> Iterator[tuple]:
        """`(loss, aux, grad_sq)` of each batch in turn: the same updates as calling the step on each (bit for
        bit with torch 2.13), made `steps_per_call` per compiled call, so a call's fixed cost (dynamo's
        guards, inductor's Python wrapper, the bookkeeping here) is paid once per 4 steps, for a longer cold
        compile (results/benchmarks/compiled_steps_per_call.md). Lazy: a consumer that stops at a non-finite
        loss stops the updates after that call's steps."""
        for i in range(0, len(batches), self.steps_per_call):
            yield from self._call(batches[i : i + self.steps_per_call])

    def _call(self, batches: Sequence[tuple]) -> list[tuple]:
        states = [self._state(p) for p in self.params]
        (group,) = self.optimizer.param_groups
        # torch.optim.Adam computes the bias corrections in Python floats (double) from the step count
        beta1, beta2 = group["betas"]
        done = float(states[0]["step"])
        ks = [done + j for j in range(1, len(batches) + 1)]
        with torch.no_grad():
            return self._steps(
                [p.detach() for p in self.params],
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [s["step"] for s in states],
                [torch.tensor(group["lr"] / (1.0 - beta1**k)) for k in ks],  # step sizes
                [torch.tensor((1.0 - beta2**k) ** 0.5) for k in ks],  # sqrt of the second bias correction
                self.g_sum,
                (beta1, beta2, group["eps"]),
                batches,
            )

    def _pure_steps(self, params, exp_avgs, exp_avg_sqs, steps, step_sizes, bc2_sqrts, g_sum, hyper, batches):
        return [
            self._pure_step(params, exp_avgs, exp_avg_sqs, steps, step_size, bc2_sqrt, g_sum, hyper, *batch)
            for step_size, bc2_sqrt, batch in zip(step_sizes, bc2_sqrts, batches, strict=True)
        ]

    def _pure_step(self, params, exp_avgs, exp_avg_sqs, steps, step_size, bc2_sqrt, g_sum, hyper, *batch):
        def loss_of(p):
            loss, aux = torch.func.functional_call(self.module, p, batch, strict=False, tie_weights=False)
            return loss, (loss, aux)

        with torch.enable_grad():
            grads, (loss, aux) = torch.func.grad(loss_of, has_aux=True)(
                dict(zip(self.names, params, strict=True))
            )
        grad_sq = torch.zeros(())
        if self.stat_names:
            g = torch.cat([grads[n].reshape(-1) for n in self.stat_names])
            g_sum.add_(g)
            grad_sq = g.dot(g)
        grads = [grads[n] for n in self.names]
        if self.max_grad_norm > 0:  # nn.utils.clip_grad_norm_ (norm_type 2, no foreach)
            total = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0
            )
            coef = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
            grads = [g * coef for g in grads]
        beta1, beta2, eps = hyper  # constants of the run (dynamo specialises on them)
        for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True):  # torch's Adam
            s.add_(1.0)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(step_size * m / ((v.sqrt() / bc2_sqrt) + eps))
        return loss.detach(), aux, grad_sq


def check_compiler() -> None:
    """Fail at start-up, not after the first rollout, when inductor's CPU backend has no C++ compiler."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as err:  # the private helper's location or errors may change between torch versions
        raise SystemExit(
            f"ERROR: --compile needs a C++ compiler for torch.compile's CPU backend ({err}); install one "
            "(e.g. g++) or set CXX, or run without --compile (the eager update is the same algorithm)"
        ) from err


# TRPO's fast path: the Fisher-vector products in closed form for the Gaussian policy of common.Agent.
def gauss_newton_fvp(agent, obs, kl, params, damping):
    """v -> (F + damping I) v in closed form, F the Fisher information of pi_old on `obs` (--compile's path).

    At pi_old the Hessian of the mean KL is F = J^T diag(exp(-2 logstd)) J / N on actor_mean's parameters (J:
    the Jacobian of the mean over the batch) and 2 I on actor_logstd (no cross terms). J v is pushed forward
    and J^T u pulled back through actor_mean's activations at pi_old, computed once: the same products as
    `fisher_vector_product` up to float rounding, without rebuilding or re-differentiating a graph (speed:
    results/benchmarks/trpo_fvp.md)."""
    l0, _, l1, _, l2 = agent.actor_mean
    w1, w2 = l1.weight.detach(), l2.weight.detach()
    with torch.no_grad():
        h1 = torch.tanh(l0(obs))
        h2 = torch.tanh(l1(h1))
        dtanh1, dtanh2 = 1 - h1 * h1, 1 - h2 * h2
        precision = torch.exp(-2 * agent.actor_logstd) / obs.shape[0]

    def fvp(v):
        dw0, db0, dw1, db1, dw2, db2, dlogstd = (
            t.view_as(p) for t, p in zip(v.split([p.numel() for p in params]), params, strict=True)
        )
        dh1 = dtanh1 * torch.addmm(db0, obs, dw0.T)  # J v, layer by layer
        dh2 = dtanh2 * torch.addmm(db1, h1, dw1.T).addmm_(dh1, w1.T)
        u = torch.addmm(db2, h2, dw2.T).addmm_(dh2, w2.T) * precision
        g2 = (u @ w2) * dtanh2  # J^T u, layer by layer
        g1 = (g2 @ w1) * dtanh1
        return (
            torch.cat(
                [
                    t.reshape(-1)
                    for t in (g1.T @ obs, g1.sum(0), g2.T @ h1, g2.sum(0), u.T @ h2, u.sum(0), 2 * dlogstd)
                ]
            )
            + damping * v
        )

    return fvp
