"""Where a MuJoCo script's time goes, and what two candidate speed-ups would buy (toward a 2x speed-up).

    python -m rgpo_lab.benchmarks.mujoco_profile --out results/benchmarks/mujoco_profile

It measures the lab runner (`rgpo_lab.mujoco_runner`, the scripts before issue 48): "the script(s)" below
mean its PPO, not the single-file scripts in mujoco_baselines/.

Per environment step of a rollout, in rotating order over ``--rounds`` rounds (median of rounds, us/step):
the script's per-step policy sample (``actor_mean`` through ``nn.Module`` calls), the same function applied to
the same weights without module calls (``F.linear``/``tanh``; asserted bit-identical), the script's
environment (``MujocoEnv.step``: gymnasium's ``gym.make`` stack plus our normalisation), gymnasium's
``env.step`` with random actions (the raw step rate), the unwrapped environment's ``step``, and
``mujoco.mj_step`` alone (the physics: the floor).

Per PPO mini-batch update step (Hopper-v4 shapes, width 64 and 256), interleaved step by step (median of
per-epoch ratios): the script's eager step (forward, loss, backward, gradient statistics, clip, Adam), the
same step as one ``torch.compile``d pure function (``torch.func.grad`` of the loss, clipping and Adam written
out; changes float rounding; the first prototype), the scripts' ``--compile`` step (``CompiledAdamStep``: in
place, with the gradient statistics), and the GEMMs of the step alone (forward and backward matrix products of
both networks: what no overhead removal can go below).

It projects SPS per configuration as 1 / (rollout per step + 320 / 2048 update steps per environment step),
ignoring GAE and logging (a few %), so the projection is an upper bound of what each change gives.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time

from rgpo_lab.benchmarks.common import RESULTS, invocation
from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS


def rollout_costs(env_id: str, width: int, n: int, rounds: int) -> dict[str, float]:
    import gymnasium as gym
    import mujoco
    import numpy as np
    import torch

    from rgpo_lab.mujoco_runner import ppo_continuous_action as script

    args = script.Args(env_id=env_id, hidden_size=width)
    env = script.MujocoEnv(args)
    agent = script.Agent(env.obs_dim, env.act_dim, args)
    obs = torch.randn(n, env.obs_dim)
    noise = torch.randn(n, env.act_dim)
    actions = torch.zeros(n, env.act_dim)
    raw_mean = agent.mean_action  # the same function as agent.actor_mean, without nn.Module calls

    with torch.inference_mode():
        assert torch.equal(raw_mean(obs[:64]), agent.actor_mean(obs[:64])), (
            "raw path is not the same function"
        )

    def policy(mean_fn):
        def run():
            with torch.inference_mode():
                std = torch.exp(agent.actor_logstd)
                for t in range(n):
                    a = mean_fn(obs[t]) + std * noise[t]
                    actions[t] = a
                    a.numpy()

        return run

    rand = np.random.default_rng(0).uniform(-1, 1, (n, env.act_dim))
    env.reset(seed=0)
    genv = gym.make(env_id)
    genv.reset(seed=0)
    uenv = gym.make(env_id).unwrapped
    uenv.reset(seed=0)
    m_env = gym.make(env_id).unwrapped
    m_env.reset(seed=0)

    def env_script():
        for t in range(n):
            env.step(rand[t])

    def env_gym():
        for t in range(n):
            _, _, term, trunc, _ = genv.step(rand[t])
            if term or trunc:
                genv.reset()

    def env_unwrapped():
        for t in range(n):
            _, _, term, _, _ = uenv.step(rand[t])
            if term:
                uenv.reset()

    def mj_step():
        for t in range(n):
            m_env.data.ctrl[:] = rand[t]
            mujoco.mj_step(m_env.model, m_env.data, nstep=m_env.frame_skip)

    parts = {
        "policy_module": policy(agent.actor_mean),
        "policy_raw": policy(raw_mean),
        "env_script": env_script,
        "env_gym": env_gym,
        "env_unwrapped": env_unwrapped,
        "mj_step": mj_step,
    }
    times: dict[str, list[float]] = {k: [] for k in parts}
    for r in range(rounds):
        names = list(parts)[r % len(parts) :] + list(parts)[: r % len(parts)]
        for name in names:
            t0 = time.perf_counter()
            parts[name]()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def update_costs(width: int, epochs: int) -> dict[str, float]:
    import torch
    import torch.nn as nn
    from torch.func import grad
    from torch.nn.utils.stateless import _reparametrize_module

    from rgpo_lab.mujoco_runner import ppo_continuous_action as script

    torch.manual_seed(0)
    obs_dim, act_dim, T, mb = 11, 3, 2048, 64
    args = script.Args(hidden_size=width)
    eager = script.Agent(obs_dim, act_dim, args)
    shadow = copy.deepcopy(eager)
    obs, act, adv, ret = torch.randn(T, obs_dim), torch.randn(T, act_dim), torch.randn(T), torch.randn(T)
    with torch.no_grad():
        old_lp, old_v = eager.log_prob(eager.actor_mean(obs), act), eager.critic(obs).squeeze(-1)

    def loss_fn(agent, idx):
        newlp = agent.log_prob(agent.actor_mean(obs[idx]), act[idx])
        newv = agent.critic(obs[idx]).squeeze(-1)
        a = (adv[idx] - adv[idx].mean()) / (adv[idx].std() + 1e-8)
        pg = script.ppo_policy_loss(newlp, old_lp[idx], a, 0.2)
        mv, mr = old_v[idx], ret[idx]
        vc = mv + (newv - mv).clamp(-0.2, 0.2)
        return pg + 0.5 * 0.5 * torch.max((newv - mr) ** 2, (vc - mr) ** 2).mean()

    opt = torch.optim.Adam(eager.parameters(), lr=3e-4, eps=1e-5)
    pol = eager.policy_parameters()

    def eager_step(idx):  # the script's step
        loss = loss_fn(eager, idx)
        bool(torch.isfinite(loss))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        g = torch.cat([p.grad.reshape(-1) for p in pol])
        float(g.dot(g))
        nn.utils.clip_grad_norm_(eager.parameters(), 0.5)
        opt.step()

    names = [n for n, _ in shadow.named_parameters()]
    pol_names = [n for n in names if not n.startswith("critic")]
    state = {
        "p": {n: p.detach().clone() for n, p in shadow.named_parameters()},
        "m": {n: torch.zeros_like(p) for n, p in shadow.named_parameters()},
        "v": {n: torch.zeros_like(p) for n, p in shadow.named_parameters()},
        "k": 0,
    }

    def pure_loss(params, idx):
        with _reparametrize_module(shadow, params):
            return loss_fn(shadow, idx)

    def pure_step(params, m, v, k, idx):  # one graph: gradients, statistics, clipping, Adam
        grads = grad(pure_loss)(params, idx)
        gg = sum((grads[n] * grads[n]).sum() for n in pol_names)
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(grads[n]) for n in names]))
        c = torch.clamp(0.5 / (total + 1e-6), max=1.0)
        out_p, out_m, out_v = {}, {}, {}
        for n in names:
            g = grads[n] * c
            out_m[n] = m[n].lerp(g, 0.1)
            out_v[n] = v[n] * 0.999 + 0.001 * g * g
            denom = (out_v[n] / (1 - 0.999**k)).sqrt() + 1e-5
            out_p[n] = params[n] - 3e-4 / (1 - 0.9**k) * out_m[n] / denom
        return out_p, out_m, out_v, gg

    compiled = torch.compile(pure_step)

    def compiled_step(idx):
        state["k"] += 1
        k = torch.tensor(float(state["k"]))
        state["p"], state["m"], state["v"], gg = compiled(state["p"], state["m"], state["v"], k, idx)
        float(gg)

    h = width
    mats = [(torch.randn(h, obs_dim), torch.randn(h, h), torch.randn(a, h)) for a in (act_dim, 1)]
    x, hid, gh = torch.randn(mb, obs_dim), torch.randn(mb, h), torch.randn(mb, h)

    def gemm_step(idx):  # forward and backward products of both networks (weights and inputs)
        for w1, w2, w3 in mats:
            o = hid @ w3.T
            x @ w1.T, hid @ w2.T, o.T @ hid, o @ w3, gh.T @ hid, gh @ w2, gh.T @ x

    from rgpo_lab.mujoco_runner.compiled_update import CompiledAdamStep

    # the scripts' --compile step (in-place Adam, gradient statistics) from the same start
    twin = copy.deepcopy(shadow)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=3e-4, eps=1e-5)
    script_step = CompiledAdamStep(
        twin,
        twin_opt,
        lambda agent, idx: (loss_fn(agent, idx), ()),
        list(twin.parameters()),
        0.5,
        twin.policy_parameters(),
    )

    def script_compiled_step(idx):
        float(script_step(idx)[2])

    t0 = time.perf_counter()
    for _ in range(3):
        compiled_step(torch.randperm(T)[:mb])
    compile_s = time.perf_counter() - t0
    for _ in range(3):
        script_compiled_step(torch.randperm(T)[:mb])
    steps = {
        "eager": eager_step,
        "compiled": compiled_step,
        "script_compiled": script_compiled_step,
        "gemm_floor": gemm_step,
    }
    per_epoch: dict[str, list[float]] = {k: [] for k in steps}
    for e in range(epochs):
        perm = torch.randperm(T)
        acc = dict.fromkeys(steps, 0.0)
        order = list(steps)[e % len(steps) :] + list(steps)[: e % len(steps)]
        for s in range(0, T, mb):
            idx = perm[s : s + mb]
            for name in order:
                t0 = time.perf_counter()
                steps[name](idx)
                acc[name] += time.perf_counter() - t0
        for name in steps:
            per_epoch[name].append(acc[name] / (T // mb) * 1e6)
    out = {f"{k}_us": statistics.median(v) for k, v in per_epoch.items()}
    out["compiled_speedup"] = statistics.median(
        a / b for a, b in zip(per_epoch["eager"], per_epoch["compiled"], strict=True)
    )
    out["script_compiled_over_floor"] = statistics.median(
        a / b for a, b in zip(per_epoch["script_compiled"], per_epoch["gemm_floor"], strict=True)
    )
    out["eager_over_floor"] = statistics.median(
        a / b for a, b in zip(per_epoch["eager"], per_epoch["gemm_floor"], strict=True)
    )
    out["compile_s"] = compile_s
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.mujoco_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=os.path.join(RESULTS, "mujoco_profile"))
    p.add_argument("--steps", type=int, default=2000, help="environment steps per rollout measurement")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=12, help="update epochs (32 steps each) per width")
    p.add_argument("--envs", nargs="+", default=ENVS)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    result = {
        "command": invocation("mujoco_profile"),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "rollout": {},
        "update": {},
    }
    for width in (64, 256):
        result["update"][width] = update_costs(width, a.epochs)
        print(width, result["update"][width], flush=True)
    for env_id in a.envs:
        result["rollout"][env_id] = rollout_costs(env_id, 256, a.steps, a.rounds)
        print(env_id, result["rollout"][env_id], flush=True)
    result["load_average_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(a.out + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    lines = [
        "# Where a MuJoCo script's time goes",
        "",
        f"Command: `{r['command']}`  ",
        f"Machine: {r['machine']}, {r['cpus']} CPUs, torch {r['torch']}, one torch thread; load average at "
        f"end {', '.join(f'{x:.1f}' for x in r['load_average_end'])}. Medians of interleaved rounds.",
        "",
        "## Update: one PPO mini-batch step (Hopper-v4 shapes, 64 samples)",
        "",
        "| width | eager (the scripts) us | one compiled pure function us | speed-up | the scripts' "
        "--compile step us | GEMMs alone us | eager / GEMMs | --compile step / GEMMs | compile s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w, u in r["update"].items():
        script = f"{u['script_compiled_us']:.0f} | " if "script_compiled_us" in u else "- | "
        ratio = f"{u['script_compiled_over_floor']:.1f} | " if "script_compiled_over_floor" in u else "- | "
        lines.append(
            f"| {w} | {u['eager_us']:.0f} | {u['compiled_us']:.0f} | {u['compiled_speedup']:.2f}x | "
            f"{script}{u['gemm_floor_us']:.0f} | {u['eager_over_floor']:.1f} | {ratio}{u['compile_s']:.0f} |"
        )
    lines += [
        "",
        "## Rollout, per environment step (us; width 256)",
        "",
        "| env | policy (nn.Module) | policy (same weights, no modules) | script env | gymnasium env.step "
        "(raw rate, steps/s) | unwrapped step | mj_step (physics) |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id, c in r["rollout"].items():
        lines.append(
            f"| {env_id} | {c['policy_module']:.0f} | {c['policy_raw']:.0f} | {c['env_script']:.0f} | "
            f"{c['env_gym']:.0f} ({1e6 / c['env_gym']:.0f}) | {c['env_unwrapped']:.0f} | {c['mj_step']:.0f} |"
        )
    u = r["update"][256] if 256 in r["update"] else r["update"]["256"]
    lines += [
        "",
        "## Projected SPS at width 256 (upper bounds: GAE, logging and Python between steps ignored)",
        "",
        "| env | today | compiled update | + policy without modules + unwrapped env | ratio to today |",
        "|---|---|---|---|---|",
    ]
    per_env_update = 320 / 2048
    for env_id, c in r["rollout"].items():
        today = 1e6 / (c["policy_module"] + c["env_script"] + per_env_update * u["eager_us"])
        comp = 1e6 / (c["policy_module"] + c["env_script"] + per_env_update * u["compiled_us"])
        best = 1e6 / (
            c["policy_raw"]
            + c["env_unwrapped"]
            + (c["env_script"] - c["env_gym"])
            + per_env_update * u["compiled_us"]
        )
        lines.append(f"| {env_id} | {today:.0f} | {comp:.0f} | {best:.0f} | {best / today:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
