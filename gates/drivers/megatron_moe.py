"""Gate 5 driver: a few logged training steps of one Megatron-core MoE block with random weights.

Our own code (no Megatron source is copied): it imports megatron.core from the pinned, patched Megatron-LM
tree (upstreams.lock: megatron-lm) on PYTHONPATH and runs under torchrun, one process per GPU.

Model (a Qwen3-30B-A3B-like MoE block, sizes from the command line): token embedding -> RMSNorm ->
megatron.core MoELayer (TopKRouter, SequentialMLP experts from Megatron's local, non-TE spec, SwiGLU) with a
residual -> output projection -> cross entropy. Data: one fixed random batch per rank (seed + rank), so
training on it must lower the loss. Optimizer: torch AdamW. Dense weights are data parallel over all ranks,
experts are expert parallel (EP = world size, TP = PP = 1).

Arms (`--dispatcher`): `flex-deepep` = Megatron's MoEFlexTokenDispatcher with the DeepEP backend
(_DeepepManager -> fused_a2a, which prefers DeepEP V2 ElasticBuffer: PR #4632); `alltoall` = Megatron's own
MoEAlltoAllTokenDispatcher (the comparison arm). Megatron refuses the flex/DeepEP dispatcher at TP x EP = 1
("DeepEP dispatcher requires TPxEP > 1"); with `--allow-ep1-deepep` the driver builds the same dispatcher
through a subclass that skips only that guard (it says so in its output).

Output (rank 0 unless noted; parsed by reprostack.gates.parsers.training), one `[megatron-moe]` line each:
  config: key=value ...
  dispatcher: <class> comm=<class> [guard=bypassed-ep1]
  init_checksum: <float>          (sum of all parameters as float64 after init, all ranks reduced)
  buffer: <class> module=<module> (flex-deepep, after step 1: the DeepEP buffer fused_a2a built)
  step i/N | loss L | grad_norm G | tokens/s T | step_ms M
  transport: node=<n> efa_tx_bytes=<int> source=hw_counters devices=<k>   (local rank 0 of each node)
  transport: node=<n> no EFA device
  done: N steps
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import time

TAG = "[megatron-moe]"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatcher", choices=["flex-deepep", "alltoall"], required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--num-experts", type=int, default=128)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=1024, help="FFN size of each expert")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--allow-ep1-deepep", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="gloo + CPU (smoke test of the driver only)")
    return ap.parse_args(argv)


def say(*parts) -> None:
    print(TAG, *parts, flush=True)


def efa_tx_bytes(root: str = "/sys/class/infiniband") -> tuple[int | None, int]:
    """(sum of tx_bytes over every port of every EFA device, number of EFA devices); (None, 0) without any."""
    total, devices, seen = 0, 0, False
    for dev in sorted(glob.glob(os.path.join(root, "*"))):
        try:
            if os.path.basename(os.readlink(os.path.join(dev, "device", "driver"))) != "efa":
                continue
        except OSError:
            continue
        devices += 1
        for f in glob.glob(os.path.join(dev, "ports", "*", "hw_counters", "tx_bytes")):
            try:
                total += int(open(f).read().strip())
                seen = True
            except (OSError, ValueError):
                pass
    return (total if seen else None), devices


def build(args, torch, dist):
    """Process groups, config, model (same seed -> same weights in both arms)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe import moe_layer, token_dispatcher as td
    from megatron.core.transformer.transformer_config import TransformerConfig

    world = dist.get_world_size()
    parallel_state.initialize_model_parallel(expert_model_parallel_size=world, create_gloo_process_groups=False)
    torch.manual_seed(args.seed)
    if not args.cpu:
        model_parallel_cuda_manual_seed(args.seed)
    dtype = torch.float32 if args.cpu else torch.bfloat16
    config = TransformerConfig(
        num_layers=1,
        hidden_size=args.hidden,
        num_attention_heads=16,
        ffn_hidden_size=args.ffn,
        moe_ffn_hidden_size=args.ffn,
        num_moe_experts=args.num_experts,
        moe_router_topk=args.topk,
        moe_token_dispatcher_type="flex" if args.dispatcher == "flex-deepep" else "alltoall",
        moe_flex_dispatcher_backend="deepep",
        moe_router_dtype="fp32",
        moe_grouped_gemm=False,
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_permute_fusion=False,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        bf16=not args.cpu,
        params_dtype=dtype,
        expert_model_parallel_size=world,
        tensor_model_parallel_size=1,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=args.cpu,
        sequence_parallel=False,
    )
    bypassed = False
    if args.dispatcher == "flex-deepep" and world == 1:
        if not args.allow_ep1_deepep:
            raise SystemExit(f"{TAG} flex-deepep at EP1: Megatron refuses it (TPxEP > 1); pass --allow-ep1-deepep")
        moe_layer.MoEFlexTokenDispatcher = _ep1_flex_class(td)
        bypassed = True

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(args.vocab, args.hidden, dtype=dtype)
            self.norm = torch.nn.RMSNorm(args.hidden, dtype=dtype)
            self.moe = get_moe_module_spec(use_te=False, num_experts=args.num_experts)(config=config)
            self.head = torch.nn.Linear(args.hidden, args.vocab, bias=False, dtype=dtype)

        def forward(self, tokens, targets):
            h = self.embed(tokens)  # [s, b, h]
            out, _bias = self.moe(self.norm(h))
            logits = self.head(h + out).float()  # [s, b, vocab]
            return torch.nn.functional.cross_entropy(logits.view(-1, args.vocab), targets.view(-1))

    model = Model()
    if not args.cpu:
        model = model.cuda()
    return model, bypassed


def _ep1_flex_class(td):
    """MoEFlexTokenDispatcher with the DeepEP backend, built without the TPxEP > 1 guard (EP1 only);
    every other method is Megatron's."""

    class EP1FlexTokenDispatcher(td.MoEFlexTokenDispatcher):
        def __init__(self, num_local_experts, local_expert_indices, config, pg_collection=None):
            td.MoETokenDispatcher.__init__(self, config=config, pg_collection=pg_collection)
            self.num_local_experts = num_local_experts
            self.local_expert_indices = local_expert_indices
            self._comm_manager = td._DeepepManager(
                group=self.tp_ep_group,
                num_local_experts=num_local_experts,
                router_topk=self.tp_size * config.moe_router_topk,
                num_experts=self.tp_size * config.num_moe_experts,
                config=config,
            )
            self.cudagraph_attrs = ["_comm_manager.token_probs", "_comm_manager.token_indices"]

    return EP1FlexTokenDispatcher


def grad_norm(model, torch, dist) -> float:
    """Global L2 norm of the gradients: dense grads are averaged over all ranks first (data parallel),
    expert grads (param.allreduce == False) live on one rank each and are scaled by 1/world."""
    world = dist.get_world_size()
    dense, expert = [], []
    for p in model.parameters():
        if p.grad is None:
            continue
        if getattr(p, "allreduce", True):
            if world > 1:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
            dense.append(p.grad)
        else:
            if world > 1:
                p.grad.div_(world)
            expert.append(p.grad)
    dev = dense[0].device if dense else expert[0].device
    sq_dense = sum((g.float().pow(2).sum() for g in dense), torch.zeros((), device=dev, dtype=torch.float64))
    sq_exp = sum((g.float().pow(2).sum() for g in expert), torch.zeros((), device=dev, dtype=torch.float64))
    if world > 1:
        dist.all_reduce(sq_exp)
    return math.sqrt(float(sq_dense + sq_exp))


def main(argv=None) -> int:
    args = parse_args(argv)
    tokens_per_rank = args.seq_len * args.micro_batch
    # fused_a2a reads the V2 buffer shape at import time (PR #4632); make it the model's
    os.environ.setdefault("MCORE_DEEPEP_V2_HIDDEN", str(args.hidden))
    os.environ.setdefault("MCORE_DEEPEP_V2_NUM_TOPK", str(args.topk))
    os.environ.setdefault("MCORE_DEEPEP_V2_MAX_TOKENS_PER_RANK", str(tokens_per_rank))
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not args.cpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = int(os.environ.get("GROUP_RANK", "0"))
    model, bypassed = build(args, torch, dist)
    dev = torch.device("cpu") if args.cpu else torch.device("cuda", local_rank)
    if rank == 0:
        say(
            f"config: arm={args.dispatcher} world={world} ep={world} experts={args.num_experts} topk={args.topk} "
            f"hidden={args.hidden} ffn={args.ffn} tokens_per_rank={tokens_per_rank} vocab={args.vocab} "
            f"seed={args.seed} lr={args.lr} steps={args.steps} dtype={'fp32' if args.cpu else 'bf16'} "
            f"torch={torch.__version__}"
        )
        disp = model.moe.token_dispatcher
        comm = getattr(disp, "_comm_manager", None)
        say(
            f"dispatcher: {type(disp).__name__} base={type(disp).__mro__[1].__name__} "
            f"comm={type(comm).__name__ if comm is not None else '-'}" + (" guard=bypassed-ep1" if bypassed else "")
        )
    checksum = torch.tensor(
        sum(float(p.detach().double().sum()) for p in model.parameters()), dtype=torch.float64, device=dev
    )
    dist.all_reduce(checksum)
    if rank == 0:
        say(f"init_checksum: {float(checksum):.10e}")

    gen = torch.Generator().manual_seed(args.seed + rank)
    tokens = torch.randint(args.vocab, (args.seq_len, args.micro_batch), generator=gen).to(dev)
    targets = torch.randint(args.vocab, (args.seq_len, args.micro_batch), generator=gen).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    tx0, ndev = efa_tx_bytes()
    for step in range(1, args.steps + 1):
        if not args.cpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        gn = grad_norm(model, torch, dist)
        opt.step()
        mean_loss = loss.detach().double()
        dist.all_reduce(mean_loss)
        if not args.cpu:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if rank == 0:
            say(
                f"step {step}/{args.steps} | loss {float(mean_loss) / world:.6f} | grad_norm {gn:.6f} | "
                f"tokens/s {tokens_per_rank * world / dt:.1f} | step_ms {dt * 1e3:.1f}"
            )
            if step == 1 and args.dispatcher == "flex-deepep":
                from megatron.core.transformer.moe import fused_a2a

                buf = fused_a2a._buffer
                say(
                    f"buffer: {type(buf).__name__} module={type(buf).__module__} "
                    f"have_deep_ep_v2={getattr(fused_a2a, 'HAVE_DEEP_EP_V2', None)}"
                )
    tx1, _ = efa_tx_bytes()
    if local_rank == 0:
        if ndev == 0:
            say(f"transport: node={node} no EFA device")
        elif tx0 is None or tx1 is None:
            say(f"transport: node={node} efa devices={ndev} no hw_counters/tx_bytes")
        else:
            say(f"transport: node={node} efa_tx_bytes={tx1 - tx0} source=hw_counters devices={ndev}")
    dist.barrier()
    if rank == 0:
        say(f"done: {args.steps} steps")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
