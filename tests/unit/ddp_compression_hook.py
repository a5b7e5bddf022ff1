"""PyTorch's own DDP gradient-compression hook on two gloo ranks over loopback: each rank's
flattened gradients (raw float32 files) go through default_hooks.bf16_compress_hook or
fp16_compress_hook as one bucket, and rank 0 writes the decompressed average (raw float32).

Usage: python ddp_compression_hook.py bf16|fp16 RANK0.f32 RANK1.f32 OUT.f32
"""
import socket
import sys

import numpy
import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

HOOKS = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}


def rank_main(rank, world_size, port, hook_name, inputs, output):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    buffer = torch.from_numpy(numpy.fromfile(inputs[rank], dtype=numpy.float32))
    # A GradBucket is opaque to Python; the hooks also take a tuple holding the bucket's buffer.
    average = HOOKS[hook_name](None, (buffer,)).wait()
    if rank == 0:
        average.numpy().astype(numpy.float32).tofile(output)
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in HOOKS:
        sys.exit(__doc__.strip())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inputs = sys.argv[2:4]
    multiprocessing.start_processes(rank_main, args=(len(inputs), port, sys.argv[1], inputs,
                                                     sys.argv[4]),
                                    nprocs=len(inputs), start_method="fork")


if __name__ == "__main__":
    main()
