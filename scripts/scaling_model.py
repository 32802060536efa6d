#!/usr/bin/env python3
"""scripts/scaling_model.py: the model of fox.c's data-parallel scaling (docs/scaling.md).

Pure Python 3, standard library only. Every input is stated below with its source; everything else is
arithmetic on them.

    python3 scripts/scaling_model.py               the tables, as plain text (the same as --markdown)
    python3 scripts/scaling_model.py --markdown    the tables docs/scaling.md embeds, exactly
    python3 scripts/scaling_model.py --check       asserts hand-computed values, and that docs/scaling.md's
                                                   tables are this output (exit 0 when all hold)
    python3 scripts/scaling_model.py --markdown --memory-log FILE
                                                   the memory table with the cells that FILE (the output
                                                   of scripts/bench_memory.sh) measured filled in, and on
                                                   stderr those cells as MEASURED_MEMORY entries to paste below
    python3 scripts/scaling_model.py --fill-doc    rewrites the tables of docs/scaling.md with this output
                                                   (after MEASURED_MEMORY changed); --check then compares them

What fox.c sends per step and rank (train_fox.cu, one rank per GPU, batch 1 sequence per GPU):
  * the gradient all-reduce: fp32 (ncclFloat, ncclAvg), the whole gradient, 4 bytes a parameter, in L + 3
    grouped calls issued as the backward finishes each piece (lm_head, lnf, block L-1 .. block 0, wte), on a
    second stream beside the backward (reduce_final_grads in train_fox.cu); the optimizer waits for
    the last (run_model_average_grads). It is a full all-reduce even with ZeRO-1: every rank receives the
    whole averaged gradient, though it updates only its shard.
  * ZeRO-1 (--zero 1, the default with several ranks): after AdamW on its shard, each rank broadcasts its
    updated fp32 shard (N ncclBroadcast calls in one group, on the main stream, not overlapped), then every
    rank rebuilds its bf16 GEMM copies from the whole fp32 vector (gather_updated_params and
    model_refresh_bf16 in train_fox.cu). Bus traffic: that of an all-gather of 4 bytes a parameter.
  * Nothing else of size: the losses and the stop flag share one MPI reduction of a few doubles a step.
"""
import math
import os
import re
import sys

# ---------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------

# The model (docs/model.md §1.3-1.4, fox/config.h FOX_PARAMS): fox-pro: data-dependent forget gate (d -> H rows
# in attn_in_w plus a bias per head), KV-shift (2H rows), QK-norm with one weight vector per head (d weights each
# for q and k), output gate (d rows), output norm (d weights), SwiGLU MLP with ratio 3.5, untied lm_head,
# GPT-2 vocabulary (no padding in the parameters; the GPU pads to 50304 inside its GEMMs only).
VOCAB = 50257                 # docs/model.md §1.3; fox/config.h vocab_size
MLP_RATIO_X2 = 7              # fox-pro's ratio 3.5 (fox/config.h FOX_PRESETS)

# The sizes: (layers, d_model, heads). 125M, 360M and 760M are the FoX paper's (docs/model.md §1.3, head
# dimension 64). 1.3B is not in the paper: GPT-3 XL's 24 layers x d 2048, taken with FoX's head dimension 64
# (32 heads) as every FoX configuration uses; GPT-3 XL's own head dimension 128 (16 heads) would change only
# attn_in_w's per-head rows and the gate biases, 3 x 16 x 2048 + 16 = 98,320 parameters a layer (0.2% of the model).
SIZES = [
    ("125M", 12, 768, 12),
    ("360M", 24, 1024, 16),
    ("760M", 24, 1536, 24),
    ("1.3B", 24, 2048, 32),
]

PEAK = 989.4e12               # bf16 dense FLOP/s of an H100/H200 (docs/model.md §6, the MFU formula's peak)
CTX_PAPER = 16384             # the paper's training context
BATCH_PAPER = 524288          # the paper's tokens per step: 512Ki = 32 x 16384 (docs/model.md §2)

# Measured, H200, bf16, fox-pro, batch 1 x 16384 tokens per GPU, --recompute 0, deterministic, 2026-11-29:
# `LEVELS=0 NONDET=0 sh scripts/bench_train.sh 8` and `RANKS=2 LEVELS=0 NONDET=0 sh scripts/bench_train.sh 8`
# (mpirun on one node, 2 H200 joined by NVLink NV18; ZeRO-1, the default). tokens/s counts every rank's tokens.
MEASURED_16K = {              # size: (1 GPU tokens/s, its MFU, 2 GPUs tokens/s)
    "125M": (239842.0, 0.400, 454700.0),
    "760M": (53983.0, 0.446, 103975.0),
}
# Measured, H200, --recompute 2, batch 1, one GPU: tokens/s and MFU at long contexts.
MEASURED_LONG = {             # (size, context): tokens/s, MFU
    ("760M", 32768): (29200.0, 0.348),
    ("760M", 65536): (17800.0, 0.343),
    ("760M", 131072): (10000.0, 0.339),   # 13.1 s a step
}
# Where a (size, context) has no measurement, the MFU assumed (modelled, not measured): at 16K the 760M's
# measured 44.6% (larger GEMMs would not do worse); at 128K the 760M's measured 33.9% at --recompute 2, the
# level a 128K context needs on one GPU for the 760M (attention is 83-91% of the FLOPs of every size there, so
# the MFU is the attention kernel's, whatever the size).
MFU_ASSUMED = {16384: 0.446, 131072: 0.339}
# The share of a step that is the backward (the window in which the gradient all-reduce can overlap): 2/3 at
# --recompute 0 (the backward's FLOPs are twice the forward's), 3/4 at --recompute 2 (it also recomputes the
# forward); 16K runs at recompute 0, 128K at recompute 2.
BWD_SHARE = {16384: 2.0 / 3.0, 131072: 3.0 / 4.0}

# Device memory, measured: NVIDIA H200, 2026-11-29, `BUDGET=420 sh scripts/bench_memory.sh` (fox-pro, batch 1,
# 3 steps, the bundled data; ~4 minutes): GiB in use after the first step (cudaMemGetInfo; everything is allocated
# up front, so it is the peak) and the mean tokens/s of steps 2-3. Every run at --recompute 0 kept all its blocks
# (none "partial"). The 760M at 128K and --recompute 0, where not one block's activations fit, ran as --recompute 1
# ("as level 1", GiB, tokens/s: same day, its own run of 3 steps; before train_fox fell back so it was refused).
# These are the entries `--markdown --memory-log FILE` printed for that output.
MEASURED_MEMORY = {           # (size, recompute level, context): (GiB in use, tokens/s)
    ("125M", 0, 16384): (11.25, 242602.0), ("125M", 0, 32768): (18.19, 157052.0),
    ("125M", 0, 65536): (31.31, 94700.0), ("125M", 0, 131072): (59.37, 52240.0),
    ("125M", 1, 16384): (7.88, 236364.0), ("125M", 1, 32768): (11.44, 153984.0),
    ("125M", 1, 65536): (17.81, 93500.0), ("125M", 1, 131072): (32.37, 51741.0),
    ("125M", 2, 16384): (6.01, 195468.0), ("125M", 2, 32768): (7.71, 126646.0),
    ("125M", 2, 65536): (10.36, 75641.0), ("125M", 2, 131072): (17.46, 41724.0),
    ("760M", 0, 16384): (41.46, 55964.0), ("760M", 0, 32768): (67.56, 37608.0),
    ("760M", 0, 65536): (120.64, 22906.0), ("760M", 0, 131072): ("as level 1", 114.3, 12478.0),
    ("760M", 1, 16384): (27.4, 52976.0), ("760M", 1, 32768): (39.43, 36430.0),
    ("760M", 1, 65536): (64.39, 22286.0), ("760M", 1, 131072): (114.3, 12612.0),
    ("760M", 2, 16384): (19.6, 43334.0), ("760M", 2, 32768): (23.85, 29270.0),
    ("760M", 2, 65536): (33.21, 17890.0), ("760M", 2, 131072): (51.95, 10037.0),
}
GIB = 1024.0 ** 3
DEVICE_GIB = [                # the device memory a run can fill (GiB), as scripts/bench_memory.sh's own fit takes it
    ("H200", 139.80),             # NVIDIA H200 (141 GB): the total cudaMemGetInfo reported in the measurement above
                                  # (nvidia-smi says 143,771 MiB = 140.4 GiB; CUDA sees 0.6 GiB less)
    ("H100", 81559 / 1024.0),     # NVIDIA H100 80GB HBM3: nvidia-smi's 81,559 MiB = 79.65 GiB, not measured with
                                  # cudaMemGetInfo (if CUDA sees less here too, its column is a little long)
]

# Links. NCCL bus bandwidth (the nccl-tests convention: an all-reduce of S bytes over N ranks moves
# 2(N-1)/N x S through each rank's link, an all-gather or reduce-scatter (N-1)/N x S).
#  * NVLink 4 (H100/H200 SXM, NVSwitch, 18 links, 450 GB/s each way): NCCL's ring reaches 370 GB/s bus bandwidth,
#    the line rate less ~20% protocol overhead (sjeaugey, NVIDIA, in NVIDIA/nccl-tests#212, 2024-05-06: "With the
#    protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe as
#    BusBw when running non-allreduce operations, or when running with NCCL_ALGO=RING"). NVLink SHARP (NVLS)
#    would give ~480 GB/s for the all-reduce; scripts/bench_train.sh sets NCCL_NVLS_ENABLE=0, so the ring's 370.
#  * Across nodes: 8 x 400 Gb/s InfiniBand NDR per node, one NIC per GPU (rail-optimised, as in DGX/HGX H100
#    SuperPODs): 46-48 GB/s per NIC in NCCL (AddyLaddy, NVIDIA, in NVIDIA/nccl-tests#290, 2025-03-03); we take 46.
#    NCCL's flat ring crosses each node boundary on one NIC per channel, with the channels spread over all 8 NICs,
#    so the all-reduce's bus bandwidth across nodes is bounded by 8 x 46 = 368 GB/s, about the NVLink ring's
#    (kiskra-nvidia, NVIDIA, in NVIDIA/nccl-tests#309, 2025-06-18: "With 8 400 Gbps NICs your peak would be at 400 GB/s";
#    NVIDIA/nccl#812: a DGX-A100's 8 x 200 Gb/s give 192 GB/s all-reduce bus bandwidth, measured by NVIDIA).
#    A two-level (intra-node reduce-scatter, inter-node all-reduce of 1/8, intra-node all-gather) schedule moves
#    the same bytes over each NIC but runs its stages one after the other; the ring pipelines them, so the model
#    takes the flat ring.
NVLINK_BUS = 370e9
NIC_BW = 46e9
GPUS_PER_NODE = 8
NICS_PER_NODE = 8
# Latency: NCCL's own cost model (src/graph/tuning.cc of NVIDIA/nccl at commit 01afd20a, Simple protocol, the
# one large messages use): a ring step costs 3.4 us over NVLink and 9.6 us over the network, a call 8.4 us more
# (x 1.9 for a multi-node ring all-reduce, the model's "plateau"); a tree all-reduce 2 x ((GPUs a node - 1) x 28
# + log2(nodes) x 50) us. NCCL picks the faster per call; we take the tree's latency at the ring's bandwidth
# (newer NCCL's trees come close to it on NVSwitch nodes), an optimistic simplification at 100s of GPUs.
LAT_BASE_RING = 8.4e-6
LAT_NVL_RING = 3.4e-6
LAT_NET_RING = 9.6e-6
LAT_RING_PLATEAU = 1.9
LAT_NVL_TREE = 28e-6
LAT_NET_TREE = 50e-6

# AdamW's memory traffic: 30 bytes a parameter unsharded (reads fp32 weight, gradient, m, v; writes weight, m, v
# and the bf16 copy), 28 with ZeRO-1 (no bf16 copy; fox/adamw.cuh), then model_refresh_bf16 reads the fp32 vector
# and writes the bf16 copies, 6 bytes a parameter over all of them (model_refresh_bf16 in train_fox.cu). Measured rate: the 760M's
# adamw_kernel took 8.7 ms a step on an H100 (docs/perf.md "Inside a training step", 2026-11-27): 836.7M x 30 B /
# 8.7 ms = 2.89 TB/s of 3.35; the same share of the H200's 4.8 TB/s HBM3e (modelled).
ADAMW_H100_S = 8.7e-3
ADAMW_BYTES, ADAMW_ZERO_BYTES, REFRESH_BYTES = 30, 28, 6
HBM_H100, HBM_H200 = 3.35e12, 4.8e12

# Context parallelism's inputs (section d): the attention kernels' rates, H100, sustained at the power cap
# (docs/perf.md "Forgetting Attention kernel", 2026-11-27: forward 451.4 TFLOP/s at (1, 24, 16384), d_h 64;
# backward 440.7); H100 and H200 share the peak. Point-to-point ring bandwidth per GPU: NVLink 370 GB/s, across
# nodes one NIC's 46 GB/s (each rank's next rank is one hop; the slowest hop sets the step).
ATTN_FWD = 451.4e12
ATTN_BWD = 440.7e12

GPU_COUNTS = [2, 8, 16, 32, 64, 128, 256, 512]
TABLE_SIZES = ["125M", "760M", "1.3B"]
TABLE_CONTEXTS = [16384, 131072]


# ---------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------

def mlp_hidden(d):
    """fox/config.h fox_mlp_hidden: I = 256 * ceil(int(d * r * 2/3) / 256)."""
    raw = d * MLP_RATIO_X2 // 3
    return 256 * ((raw + 255) // 256)


def layout(layers, d, heads):
    """fox-pro's tensors as FOX_PARAMS lists them: (name, per layer?, rows, cols)."""
    i = mlp_hidden(d)
    nin = 4 * d + 3 * heads   # q, k, v, output gate; k-shift, v-shift, forget gate (FOX_ATTN_IN_ROWS)
    return [
        ("wte", False, VOCAB, d), ("ln1_w", True, 1, d), ("attn_in_w", True, nin, d), ("fgate_b", True, 1, heads),
        ("qnorm_w", True, 1, d), ("knorm_w", True, 1, d), ("onorm_w", True, 1, d), ("attn_out_w", True, d, d),
        ("ln2_w", True, 1, d), ("mlp_in_w", True, 2 * i, d), ("mlp_out_w", True, d, i), ("lnf_w", False, 1, d),
        ("lm_head_w", False, VOCAB, d),
    ]


class Size(object):
    def __init__(self, name, layers, d, heads):
        self.name, self.layers, self.d, self.heads = name, layers, d, heads
        t = layout(layers, d, heads)
        self.per_layer = sum(r * c for (_, lay, r, c) in t if lay)
        self.tensor = dict((n, r * c * (layers if lay else 1)) for (n, lay, r, c) in t)
        self.total = sum(self.tensor.values())
        self.n_mfu = self.total - self.tensor["wte"]   # N of the MFU formula: all but the input embedding

    def flops_per_token(self, T):
        """docs/model.md §6: 3 (2N + 2 n_layer d_model T)."""
        return 3.0 * (2.0 * self.n_mfu + 2.0 * self.layers * self.d * T)

    def grad_groups(self):
        """The all-reduces of a step, in the order the backward issues them (train_fox.cu model_backward):
        (what, fp32 bytes)."""
        g = [("lm_head", 4 * self.tensor["lm_head_w"]), ("lnf", 4 * self.tensor["lnf_w"])]
        g += [("block %d" % l, 4 * self.per_layer) for l in range(self.layers - 1, -1, -1)]
        g.append(("wte", 4 * self.tensor["wte"]))
        return g


SIZE = dict((s[0], Size(*s)) for s in SIZES)


def nodes_of(n):
    return max(1, (n + GPUS_PER_NODE - 1) // GPUS_PER_NODE)


def bus_bw(n):
    """Bus bandwidth of a ring over n GPUs: NVLink inside a node, the NICs' across nodes (above)."""
    if n <= GPUS_PER_NODE:
        return NVLINK_BUS
    return min(NVLINK_BUS, NICS_PER_NODE * NIC_BW)


def allreduce_latency(n):
    """NCCL's cost model (tuning.cc), Simple protocol: the smaller of the ring's and the tree's latency."""
    if n <= 1:
        return 0.0
    nodes = nodes_of(n)
    steps, inter = 2 * (n - 1), 2 * (nodes - 1)
    ring = LAT_BASE_RING + (steps - inter) * LAT_NVL_RING + inter * LAT_NET_RING
    if nodes > 1:
        ring *= LAT_RING_PLATEAU
    ppn = min(n, GPUS_PER_NODE)
    tree = 2.0 * ((ppn - 1) * LAT_NVL_TREE + math.log(nodes, 2) * LAT_NET_TREE)
    return min(ring, tree)


def allgather_latency(n):
    """A ring all-gather's n - 1 steps (the N grouped broadcasts of ZeRO-1 taken as one all-gather: see below)."""
    if n <= 1:
        return 0.0
    nodes = nodes_of(n)
    steps, inter = n - 1, nodes - 1
    return LAT_BASE_RING + (steps - inter) * LAT_NVL_RING + inter * LAT_NET_RING


def allreduce_time(nbytes, n):
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / bus_bw(n) + allreduce_latency(n)


def zero_exchange_time(size, n):
    """ZeRO-1's N grouped ncclBroadcast of the fp32 shards: bytes of an all-gather of the fp32 vector. Taken as
    one all-gather: the broadcasts pipeline one after another when their roots follow the ring's order; if NCCL
    ran them one by one, each would pay a pipeline of N - 1 steps (N^2 step latencies in all) -- an
    ncclAllGather of equal shards avoids the question."""
    if n <= 1:
        return 0.0
    return (n - 1.0) / n * 4 * size.total / bus_bw(n) + allgather_latency(n)


def adamw_rate():
    return SIZE["760M"].total * ADAMW_BYTES / ADAMW_H100_S * (HBM_H200 / HBM_H100)


def optimizer_delta(size, n):
    """ZeRO-1's optimizer time less one GPU's: AdamW over 1/N of the parameters plus the bf16 refresh over all,
    against AdamW (with its bf16 write) over all."""
    if n <= 1:
        return 0.0
    p = size.total
    return (ADAMW_ZERO_BYTES * p / n + REFRESH_BYTES * p - ADAMW_BYTES * p) / adamw_rate()


def tokens_per_s(name, T):
    """One GPU's tokens/s at context T (batch 1), and where it comes from."""
    if T == 16384 and name in MEASURED_16K:
        return MEASURED_16K[name][0], "measured"
    if (name, T) in MEASURED_LONG:
        return MEASURED_LONG[(name, T)][0], "measured"
    mfu = MFU_ASSUMED[T]
    return mfu * PEAK / SIZE[name].flops_per_token(T), "MFU %.1f%% assumed" % (100 * mfu)


def exposed_allreduce(size, n, t_step, bwd_share):
    """The gradient all-reduces' time past the end of the backward, (no overlap, full overlap): with no overlap all
    of it; with full overlap, the comm stream works beside the backward at full speed, each group becoming ready
    as the backward finishes it (lm_head and lnf first, block l at (L - l) / L of the backward, wte at its end), and
    what remains after the backward is exposed (at least block 0's and wte's, which are ready last)."""
    groups = size.grad_groups()
    times = [allreduce_time(b, n) for (_, b) in groups]
    total = sum(times)
    t_bwd = bwd_share * t_step
    L = size.layers
    ready = [0.0, 0.0] + [(k + 1) * t_bwd / L for k in range(L)] + [t_bwd]
    finish = 0.0
    for r, t in zip(ready, times):
        finish = max(finish, r) + t
    return total, max(0.0, finish - t_bwd)


# The 2-GPU measurements the model is checked against (one node, NVLink NV18, batch 1 x 16384 a GPU, recompute 0,
# tokens/s of every rank; the 1-GPU anchor from the same machine and session): 2026-11-29 (above) and
# 2026-11-22 (docs/perf.md "Data parallel", the kernels of that day, --zero 0 and --zero 1).
CHECK_POINTS = [              # (date, size, --zero, 1 GPU tokens/s, 2 GPUs tokens/s)
    ("2026-11-29", "125M", 1, 239842.0, 454700.0),
    ("2026-11-29", "760M", 1, 53983.0, 103975.0),
    ("2026-11-22", "125M", 0, 173037.0, 339776.0),
    ("2026-11-22", "760M", 0, 43212.0, 84099.0),
    ("2026-11-22", "125M", 1, 173037.0, 338441.0),
    ("2026-11-22", "760M", 1, 43212.0, 82908.0),
]


def check_point(name, zero, tps1, tps2):
    """(measured extra seconds a step, model no overlap, model full overlap) for 2 GPUs."""
    s = SIZE[name]
    t1, t2 = CTX_PAPER / tps1, 2 * CTX_PAPER / tps2
    total, full = exposed_allreduce(s, 2, t1, BWD_SHARE[16384])
    fixed = zero_exchange_time(s, 2) + optimizer_delta(s, 2) if zero else 0.0
    return t2 - t1, total + fixed, full + fixed


def hidden_share_fit():
    """The share f of the all-reduce that the backward hides, least squares over CHECK_POINTS:
    measured = no overlap - f x (no overlap - full overlap)."""
    num = den = 0.0
    for _, name, zero, a, b in CHECK_POINTS:
        m, none_, full = check_point(name, zero, a, b)
        num += (m - none_) * (none_ - full)
        den += (none_ - full) ** 2
    return -num / den


HIDDEN_FIT = hidden_share_fit()
HIDDEN_ASSUMED = 0.0          # what the tables below take: the fit gives less than 0 (see docs/scaling.md)


def step_model(name, T, n, zero=1):
    """Step time (s) of n GPUs, batch 1 x T each: t1 (one GPU), the all-reduce's total and its exposed part with
    full overlap, ZeRO-1's exchange and optimizer change, and the step with no overlap / full overlap."""
    s = SIZE[name]
    tps, _ = tokens_per_s(name, T)
    t1 = T / tps
    if n == 1:
        return dict(t1=t1, ar=0.0, ex_full=0.0, zero=0.0, opt=0.0, none=t1, full=t1)
    total, full = exposed_allreduce(s, n, t1, BWD_SHARE[T])
    ex, opt = (zero_exchange_time(s, n), optimizer_delta(s, n)) if zero else (0.0, 0.0)
    base = t1 + ex + opt
    return dict(t1=t1, ar=total, ex_full=full, zero=ex, opt=opt,
                none=base + total - HIDDEN_ASSUMED * (total - full), full=base + full)


# Context parallelism (docs/scaling.md §d), per layer and GPU. "ring": P GPUs in one ring, zigzag chunks, K, V and c
# passed from GPU to GPU (over NVLink within a node; across nodes the ring's slowest hop is one NIC). "hybrid":
# inside each node the 8 GPUs split the heads (an all-to-all over NVLink, as DeepSpeed Ulysses), and the ring runs
# between the nodes, each GPU passing its own heads' K, V and c over its own NIC (all 8 NICs busy).
def cp_model(name, T, P, kind="ring"):
    s = SIZE[name]
    D, H = s.d, s.heads
    fwd_tok = 4 * D + 4 * H                   # k, v bf16 (2 x 2D bytes) and c fp32 (4H), a token, all heads
    bwd_tok = fwd_tok + 8 * D + 4 * H         # k, v, c again; the dK, dV fp32 accumulators; dc's column sums
    if kind == "ring":
        members, share = P, 1.0               # ring members; share of the heads (and bytes) a GPU carries
        link = NVLINK_BUS if P <= GPUS_PER_NODE else NIC_BW
    else:
        members, share = P // GPUS_PER_NODE, 1.0 / GPUS_PER_NODE
        link = NIC_BW
    chunk = float(T) / members                # tokens a ring member holds (two zigzag chunks of T / 2 members)
    flops = 2.0 * chunk * chunk * D * share   # a ring step: 2 of the 4 chunk pairs live (zigzag), 4 C^2 D each
    t_fwd_c, t_bwd_c = flops / ATTN_FWD, 2.5 * flops / ATTN_BWD    # fwd + bwd = 3.5 x fwd (docs/model.md §6)
    t_fwd_x, t_bwd_x = chunk * fwd_tok * share / link, chunk * bwd_tok * share / link
    ring_bytes = (members - 1) * chunk * (fwd_tok + bwd_tok) * share
    a2a_bytes = 0.0
    if kind != "ring":                        # q, k, v, log f in and o out; in the backward dO in, dq, dk, dv, dlog f out
        a2a_bytes = float(T) / P * (GPUS_PER_NODE - 1.0) / GPUS_PER_NODE * (16 * D + 8 * H)
    t_layer = members * (max(t_fwd_c, t_fwd_x) + max(t_bwd_c, t_bwd_x)) + a2a_bytes / NVLINK_BUS
    return dict(chunk=chunk, link=link, t_fwd_c=t_fwd_c, t_fwd_x=t_fwd_x, t_bwd_c=t_bwd_c, t_bwd_x=t_bwd_x,
                ring_bytes=ring_bytes, a2a_bytes=a2a_bytes, t_layer=t_layer,
                hidden=t_fwd_c >= t_fwd_x and t_bwd_c >= t_bwd_x,
                min_fwd=2.0 * ATTN_FWD * fwd_tok / (4.0 * D * link),
                min_bwd=bwd_tok * ATTN_BWD / (5.0 * D * link))


# ---------------------------------------------------------------------------------------------------------
# Memory (docs/scaling.md §a)
# ---------------------------------------------------------------------------------------------------------

MEM_LINE = re.compile(r"^(\S+) recompute (\d) seq (\d+): ([0-9.]+) GiB in use .*?\| (?:([0-9.]+) tok/s|no tok/s)")
NOFIT_LINE = re.compile(r"^(\S+) recompute (\d) seq (\d+): does not fit: needs ([0-9.]+) GiB")
RAN_AS = re.compile(r"\(ran as --recompute (\d): not in the fit\)")


def read_memory_log(path, table):
    """Cells from scripts/bench_memory.sh's lines ('760M recompute 2 seq 131072: 52.00 GiB in use ... | 10012
    tok/s ...'); runs at --recompute 0 that could not keep every block are left out (their memory is what the
    device had, not what they need)."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            m = NOFIT_LINE.match(line)
            if m:
                table[(m.group(1), int(m.group(2)), int(m.group(3)))] = ("does not fit", float(m.group(4)))
                continue
            m = MEM_LINE.match(line)
            ran = RAN_AS.search(line)
            if m and ran:  # --recompute 0 where not one block's activations fit: train_fox ran the next level
                tps = float(m.group(5)) if m.group(5) else None
                table[(m.group(1), int(m.group(2)), int(m.group(3)))] = ("as level %s" % ran.group(1), float(m.group(4)), tps)
                continue
            if not m or "partial" in line:
                continue
            tps = float(m.group(5)) if m.group(5) else None
            table[(m.group(1), int(m.group(2)), int(m.group(3)))] = (float(m.group(4)), tps)


def fit(points):
    """Least squares y = a + b x; (b, a)."""
    n = float(len(points))
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    b = sxy / sxx
    return b, my - b * mx


# ---------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------

def ms(x):
    return "%.1f" % (1e3 * x)


def pct(x):
    return "%.1f%%" % (100.0 * x)


def gb(x):
    return "%.2f" % (x / 1e9)


def ctx_name(T):
    return "%dK" % (T // 1024) if T < 1 << 20 else "%dM" % (T >> 20)


def table_params():
    out = ["| size | layers x d_model, heads (d_h) | MLP | parameters | N (MFU) | FLOPs a token at 16K / 128K | "
           "fp32 gradient = all-reduce buffer | largest all-reduce group |",
           "|---|---|---|---|---|---|---|---|"]
    for name, L, d, h in SIZES:
        s = SIZE[name]
        out.append("| %s | %d x %d, %d (%d) | %d | %s | %s | %.2f / %.2f GFLOP | %s GB | wte or lm_head, %s GB |" % (
            name, L, d, h, d // h, mlp_hidden(d), "{:,}".format(s.total), "{:,}".format(s.n_mfu),
            s.flops_per_token(16384) / 1e9, s.flops_per_token(131072) / 1e9, gb(4 * s.total),
            gb(4 * s.tensor["wte"])))
    return "\n".join(out)


def table_traffic():
    out = ["| size | context | one GPU: step (ms), source | all-reduce bus bytes a rank, 8 / 512 GPUs | "
           "ZeRO-1 exchange bus bytes, 8 / 512 | all-reduce time, 8 / 512 GPUs (ms) | exchange time, 8 / 512 (ms) | "
           "optimizer change, 8 / 512 (ms) |",
           "|---|---|---|---|---|---|---|---|"]
    for name in TABLE_SIZES:
        s = SIZE[name]
        for T in TABLE_CONTEXTS:
            tps, src = tokens_per_s(name, T)
            a8, a512 = step_model(name, T, 8), step_model(name, T, 512)
            out.append("| %s | %s | %s, %s | %s / %s GB | %s / %s GB | %s / %s | %s / %s | %s / %s |" % (
                name, ctx_name(T), ms(T / tps), src,
                gb(2 * 7 / 8.0 * 4 * s.total), gb(2 * 511 / 512.0 * 4 * s.total),
                gb(7 / 8.0 * 4 * s.total), gb(511 / 512.0 * 4 * s.total),
                ms(a8["ar"]), ms(a512["ar"]), ms(a8["zero"]), ms(a512["zero"]), ms(a8["opt"]), ms(a512["opt"])))
    return "\n".join(out)


def table_check():
    out = ["| measured | size | --zero | 1 GPU tokens/s | 2 GPUs tokens/s | measured: extra ms a step (scaling) | "
           "model, no overlap | model, full overlap |",
           "|---|---|---|---|---|---|---|---|"]
    for date, name, zero, one, two in CHECK_POINTS:
        m, none_, full = check_point(name, zero, one, two)
        t1 = CTX_PAPER / one
        out.append("| %s | %s | %d | %s | %s | %.2f (%s) | %.2f (%s) | %.2f (%s) |" % (
            date, name, zero, "{:,.0f}".format(one), "{:,.0f}".format(two), 1e3 * m, pct(t1 / (t1 + m)),
            1e3 * none_, pct(t1 / (t1 + none_)), 1e3 * full, pct(t1 / (t1 + full))))
    return "\n".join(out)


def table_scaling():
    out = ["| size | context | GPUs | tokens a step | all-reduce (ms) | its part past the backward with full overlap (ms) | "
           "ZeRO-1 exchange + optimizer change (ms) | step: no overlap / full overlap (ms) | "
           "efficiency: no overlap / full overlap | measured |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name in TABLE_SIZES:
        for T in TABLE_CONTEXTS:
            for n in GPU_COUNTS:
                m = step_model(name, T, n)
                meas = ""
                if n == 2 and T == CTX_PAPER and name in MEASURED_16K:
                    one, _, two = MEASURED_16K[name]
                    meas = "%s (2026-11-29)" % pct(two / (2.0 * one))
                out.append("| %s | %s | %d | %s | %s | %s | %s | %s / %s | %s / %s | %s |" % (
                    name, ctx_name(T), n, "{:,}".format(n * T), ms(m["ar"]), ms(m["ex_full"]),
                    ms(m["zero"] + m["opt"]), ms(m["none"]), ms(m["full"]), pct(m["t1"] / m["none"]),
                    pct(m["t1"] / m["full"]), meas))
    return "\n".join(out)


def table_batch():
    out = ["| GPUs | 16K: tokens a step | x the paper's 512Ki | 128K: tokens a step | x 512Ki |",
           "|---|---|---|---|---|"]
    for n in [1, 2, 4] + GPU_COUNTS[1:]:
        a, b = n * 16384, n * 131072
        out.append("| %d | %s | %s | %s | %s |" % (n, "{:,}".format(a), "%g" % (a / float(BATCH_PAPER)),
                                                  "{:,}".format(b), "%g" % (b / float(BATCH_PAPER))))
    return "\n".join(out)


def table_memory(mem):
    levels = [0, 1, 2]
    ctxs = [16384, 32768, 65536, 131072]
    head = ("| size | --recompute | " + " | ".join("%s: GiB, tokens/s" % ctx_name(T) for T in ctxs) +
            " | KiB a token (fit) | fixed GiB (fit) | " + " | ".join("context that fills an %s" % d for d, _ in DEVICE_GIB)
            + " |")
    out = [head, "|" + "---|" * (2 + len(ctxs) + 2 + len(DEVICE_GIB))]
    for name in ("125M", "760M"):
        for lv in levels:
            cells, pts = [], []
            for T in ctxs:
                v = mem.get((name, lv, T))
                if v is None:
                    cells.append("not measured")
                    continue
                if v[0] == "does not fit":
                    cells.append("does not fit (needs %.1f)" % v[1])
                    continue
                if isinstance(v[0], str):  # ran at the next level: in the table, not in the fit
                    cells.append("runs as --recompute %s: %.2f, %s" % (v[0][-1], v[1], "{:,.0f}".format(v[2])))
                    continue
                pts.append((T, v[0]))
                cells.append("%.2f, %s" % (v[0], "{:,.0f}".format(v[1]) if v[1] else "no tokens/s"))
            if len(pts) >= 2:
                b, a = fit(pts)
                fits = ["%s tokens" % "{:,.0f}".format(round((cap - a) / b, -3)) for _, cap in DEVICE_GIB]
                tail = ["%.0f" % (b * GIB / 1024.0), "%.2f" % a] + fits
            else:
                tail = ["no fit"] * (2 + len(DEVICE_GIB))
            out.append("| %s | %d | %s | %s |" % (name, lv, " | ".join(cells), " | ".join(tail)))
    return "\n".join(out)


def table_cp():
    out = ["| size | context | GPUs, layout | tokens a ring member | ring step, forward: compute / transfer (ms) | "
           "backward: compute / transfer (ms) | hidden? | bytes a GPU a layer: ring + all-to-all | attention a layer, "
           "fwd + bwd (ms) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name in ("760M", "1.3B"):
        for T in (262144, 524288, 1048576):
            for P, kind in ((8, "ring"), (16, "ring"), (16, "hybrid"), (64, "ring"), (64, "hybrid")):
                c = cp_model(name, T, P, kind)
                lay = ("ring, NVLink" if P <= GPUS_PER_NODE else "ring, one NIC a hop") if kind == "ring" else \
                    "%d nodes: heads in a node, ring between" % (P // GPUS_PER_NODE)
                out.append("| %s | %s | %d, %s | %s | %.2f / %.2f | %.2f / %.2f | %s | %s + %s GB | %s |" % (
                    name, ctx_name(T), P, lay, "{:,.0f}".format(c["chunk"]), 1e3 * c["t_fwd_c"], 1e3 * c["t_fwd_x"],
                    1e3 * c["t_bwd_c"], 1e3 * c["t_bwd_x"], "yes" if c["hidden"] else "no", gb(c["ring_bytes"]),
                    gb(c["a2a_bytes"]), ms(c["t_layer"])))
    return "\n".join(out)


def inputs_text():
    r = adamw_rate()
    z0 = step_model("760M", 16384, 8, zero=0)["none"]
    z1 = step_model("760M", 16384, 8)["none"]
    nv, ib = cp_model("760M", 1 << 20, 8), cp_model("760M", 1 << 20, 16)
    return "\n".join([
        "- Bus bandwidth: NVLink ring %.0f GB/s; across nodes min(%.0f, %d x %.0f) = %.0f GB/s." % (
            NVLINK_BUS / 1e9, NVLINK_BUS / 1e9, NICS_PER_NODE, NIC_BW / 1e9, bus_bw(16) / 1e9),
        "- All-reduce latency a call (NCCL's model, the faster of ring and tree) at 2 / 8 / 16 / 64 / 512 GPUs: "
        "%s us; fox.c makes L + 3 calls a step (15 for 125M, 27 for 760M and 1.3B)." % (
            " / ".join("%.0f" % (1e6 * allreduce_latency(n)) for n in (2, 8, 16, 64, 512))),
        "- AdamW's modelled H200 rate %.2f TB/s (the H100's measured %.2f TB/s x 4.8 / 3.35)." % (
            r / 1e12, r / 1e12 * HBM_H100 / HBM_H200),
        "- The share of the all-reduce the backward hides, least squares over the six 2-GPU measurements: f = %.2f; "
        "the tables take f = %.0f (no overlap) as the expected case and full overlap as the bound." % (
            HIDDEN_FIT, HIDDEN_ASSUMED),
        "- 760M at 16K on 8 GPUs, no overlap: %s ms a step with --zero 0, %s ms with ZeRO-1 (the exchange costs more "
        "than the sharded AdamW saves)." % (ms(z0), ms(z1)),
        "- Context parallelism hides its transfers when a ring member holds at least %s tokens (forward) and %s "
        "(backward) over NVLink, %s and %s over one NIC (760M; ring steps of compute >= transfer)." % (
            "{:,.0f}".format(nv["min_fwd"]), "{:,.0f}".format(nv["min_bwd"]), "{:,.0f}".format(ib["min_fwd"]),
            "{:,.0f}".format(ib["min_bwd"])),
    ])


def markdown(mem):
    parts = [
        ("params", table_params()),
        ("memory", table_memory(mem)),
        ("inputs", inputs_text()),
        ("traffic", table_traffic()),
        ("check", table_check()),
        ("scaling", table_scaling()),
        ("batch", table_batch()),
        ("cp", table_cp()),
    ]
    out = []
    for tag, text in parts:
        out.append("<!-- scaling_model.py: %s -->\n%s\n<!-- end %s -->" % (tag, text, tag))
    return "\n\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------
# --check: values computed by hand (docs/scaling.md shows the arithmetic)
# ---------------------------------------------------------------------------------------------------------

def check():
    """The arithmetic against values worked by hand; returns (passed, failed)."""
    fails, oks = [], []

    def eq(what, got, want, rel=0.0):
        ok = got == want if rel == 0.0 else abs(got - want) <= rel * abs(want)
        print("%s %s: %r (want %r)" % ("ok  " if ok else "FAIL", what, got, want))
        (oks if ok else fails).append(what)

    # MLP widths of SPEC.md: d 768 -> 1792, 1024 -> 2560, 1536 -> 3584; 2048 -> 4864 (int(2048*7/3) = 4778)
    eq("mlp 768", mlp_hidden(768), 1792)
    eq("mlp 1024", mlp_hidden(1024), 2560)
    eq("mlp 1536", mlp_hidden(1536), 3584)
    eq("mlp 2048", mlp_hidden(2048), 4864)
    # 125M a layer: 5 x 768 norms + (3072 + 36) x 768 + 12 + 768^2 + 3584 x 768 + 768 x 1792 = 7,109,388
    eq("125M per layer", SIZE["125M"].per_layer, 7109388)
    # 125M: 12 x 7,109,388 + 2 x 50257 x 768 + 768 = 162,508,176; N = that - 38,597,376 = 123,910,800
    eq("125M parameters", SIZE["125M"].total, 162508176)
    eq("125M N", SIZE["125M"].n_mfu, 123910800)
    # 760M: 24 x 28,429,848 + 2 x 50257 x 1536 + 1536 = 836,707,392; N = 759,512,640
    eq("760M per layer", SIZE["760M"].per_layer, 28429848)
    eq("760M parameters", SIZE["760M"].total, 836707392)
    eq("760M N", SIZE["760M"].n_mfu, 759512640)
    # the MFU the trainer printed: 239,842 x 3 (2 x 123,910,800 + 2 x 12 x 768 x 16384) / 989.4e12 = 0.39985
    eq("125M MFU", 239842 * SIZE["125M"].flops_per_token(16384) / PEAK, 0.39985, 1e-4)
    # 53,983 x 3 (2 x 759,512,640 + 2 x 24 x 1536 x 16384) / 989.4e12 = 0.44636
    eq("760M MFU", 53983 * SIZE["760M"].flops_per_token(16384) / PEAK, 0.44636, 1e-4)
    # 10,000 tokens/s at 128K: 3 (2 x 759,512,640 + 2 x 24 x 1536 x 131072) x 1e4 / 989.4e12 = 0.3390
    eq("760M 128K MFU", 1e4 * SIZE["760M"].flops_per_token(131072) / PEAK, 0.3390, 1e-3)
    # bytes of the 125M gradient all-reduce on 2 ranks: 2 (2-1)/2 x 4 x 162,508,176 = 650,032,704
    eq("125M all-reduce bus bytes, 2 ranks", 2 * (2 - 1) / 2.0 * 4 * SIZE["125M"].total, 650032704.0)
    # its bandwidth time at 370 GB/s: 650,032,704 / 370e9 = 1.7568 ms; plus 15 calls' latency 15 x (8.4 + 2 x 3.4) us
    t = sum(allreduce_time(b, 2) for _, b in SIZE["125M"].grad_groups())
    eq("125M all-reduce time, 2 ranks (s)", t, 650032704 / 370e9 + 15 * 15.2e-6, 1e-9)
    # the 2-GPU measurements: 2 x 16384 / 454,700 - 16384 / 239,842 = 3.7535 ms; 760M 11.6496 ms
    eq("125M 2-GPU extra (s)", 2 * 16384 / 454700.0 - 16384 / 239842.0, 3.7535e-3, 1e-4)
    eq("760M 2-GPU extra (s)", 2 * 16384 / 103975.0 - 16384 / 53983.0, 11.6496e-3, 1e-4)
    # the batch floor: 512 GPUs x 16384 = 8,388,608 tokens = 16 x 512Ki; 32 x 16384 = 512Ki exactly
    eq("512 x 16K", 512 * 16384, 8388608)
    eq("512 x 16K / 512Ki", 512 * 16384 // BATCH_PAPER, 16)
    eq("32 x 16K", 32 * 16384, BATCH_PAPER)
    # bus bandwidth across nodes: min(370, 8 x 46) = 368 GB/s
    eq("inter-node bus bandwidth", bus_bw(16), 368e9)
    # the 760M's per-token memory at recompute 2 from the four measured contexts (H200, 2026-11-29): x 16384,
    # 32768, 65536, 131072 (mean 61,440), y 19.60, 23.85, 33.21, 51.95 GiB (mean 32.1525); deviations x -45056,
    # -28672, 4096, 69632, y -12.5525, -8.3025, 1.0575, 19.7975; Sxx = 7,717,519,360, Sxy = 565,565.44 + 238,049.28
    # + 4,331.52 + 1,378,539.52 = 2,186,485.76; slope 2,186,485.76 / 7,717,519,360 = 2.8332e-4 GiB a token
    # (x 1024^2 = 297.1 KiB), intercept 32.1525 - 2.8332e-4 x 61,440 = 14.746 GiB; it meets the H200's 139.80 GiB
    # at (139.80 - 14.746) / 2.8332e-4 = 441,400 tokens and the H100's 79.65 at 229,100
    b, a = fit([(T, MEASURED_MEMORY[("760M", 2, T)][0]) for T in (16384, 32768, 65536, 131072)])
    eq("760M r2 slope (GiB/token)", b, 2.8332e-4, 2e-4)
    eq("760M r2 intercept (GiB)", a, 14.746, 2e-4)
    eq("760M r2 fills an H200 (tokens)", (DEVICE_GIB[0][1] - a) / b, 441400.0, 1e-3)
    eq("760M r2 fills an H100 (tokens)", (DEVICE_GIB[1][1] - a) / b, 229100.0, 1e-3)
    # the 760M at recompute 0 fits over the three contexts that kept their blocks; at 128K not one block's fit and
    # train_fox ran it as --recompute 1 (114.3 GiB, the level-1 row's): in the table, not in the fit
    eq("760M r0 128K", MEASURED_MEMORY[("760M", 0, 131072)], ("as level 1", 114.3, 12478.0))
    # context parallelism: 760M, 1M tokens on 8 ranks: 131,072 tokens a rank; a forward ring step moves
    # 131,072 x (4 x 1536 + 4 x 24) = 817,889,280 bytes and computes 2 x 131,072^2 x 1536 = 5.2777e13 FLOPs
    c = cp_model("760M", 1 << 20, 8)
    eq("CP tokens a rank", c["chunk"], 131072.0)
    eq("CP forward step bytes", c["t_fwd_x"] * NVLINK_BUS, 131072 * (4 * 1536 + 4 * 24), 1e-12)
    eq("CP forward step FLOPs", c["t_fwd_c"] * ATTN_FWD, 5.2777e13, 1e-4)
    # the hybrid on 64 GPUs (8 nodes): a GPU's ring step carries its 3 of 24 heads of 131,072 tokens over one NIC:
    # 131,072 x 6240 / 8 = 102,236,160 bytes
    h = cp_model("760M", 1 << 20, 64, "hybrid")
    eq("CP hybrid step bytes", h["t_fwd_x"] * NIC_BW, 131072 * 6240 / 8.0, 1e-12)
    # no measurable overlap at 2 GPUs: the fitted hidden share is below 0.1
    eq("hidden share fit < 0.1", HIDDEN_FIT < 0.1, True)
    return len(oks), len(fails)


DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "scaling.md")
BLOCK = re.compile(r"<!-- scaling_model.py: (\w+) -->\n.*?<!-- end \1 -->", re.S)


def blocks(text):
    return dict((m.group(1), m.group(0)) for m in BLOCK.finditer(text))


def check_doc():
    """docs/scaling.md's tables are exactly this script's output (with MEASURED_MEMORY as it stands)."""
    with open(DOC) as f:
        doc = blocks(f.read())
    out = blocks(markdown(dict(MEASURED_MEMORY)))
    bad = [k for k in out if doc.get(k) != out[k]] + [k for k in doc if k not in out]
    for k in bad:
        print("FAIL docs/scaling.md block %s differs from --markdown (python3 scripts/scaling_model.py --fill-doc)" % k)
    if not bad:
        print("ok   docs/scaling.md: its %d tables are --markdown's" % len(out))
    return bad


def fill_doc():
    """Rewrites each block of docs/scaling.md with this script's output (after MEASURED_MEMORY changed)."""
    with open(DOC) as f:
        text = f.read()
    out = blocks(markdown(dict(MEASURED_MEMORY)))
    text = BLOCK.sub(lambda m: out.get(m.group(1), m.group(0)), text)
    with open(DOC, "w") as f:
        f.write(text)


def main(argv):
    mem = dict(MEASURED_MEMORY)
    if "--memory-log" in argv:
        read_memory_log(argv[argv.index("--memory-log") + 1], mem)
        sys.stderr.write("MEASURED_MEMORY entries (paste them into scripts/scaling_model.py, then --fill-doc):\n")
        for k in sorted(mem):
            sys.stderr.write("    %r: %r,\n" % (k, mem[k]))
    if "--check" in argv:  # ends with the "N passed, M failed" line of fox.c's test suites
        passed, failed = check()
        bad = check_doc()
        passed, failed = passed + (not bad), failed + len(bad)
        print("%d passed, %d failed" % (passed, failed))
        return 1 if failed else 0
    if "--fill-doc" in argv:
        fill_doc()
        return 0
    sys.stdout.write(markdown(mem))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
