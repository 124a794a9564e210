"""OpInfo ops that run (at least partly) on the host, each with the reason. The OpInfo
sweep (``test_opinfo.py``) fails for a host op missing here (a regression) and lists the
ones here that ran fully on the device (an improvement: take them out)."""
from __future__ import annotations

#: every mode (float32 forward, with backward, bfloat16)
KNOWN_HOST_OPS: dict[str, str] = {
    "igamma": "regularized incomplete gamma: no device kernel (a series / continued "
              "fraction with data-dependent iteration counts; host)",
    "igammac": "regularized incomplete gamma: no device kernel (host)",
    "mode": "the most frequent value needs a sort and a run-length pass with eager's "
            "tie rules: no device kernel",
    "histogram": "data-dependent bin edges: no device lowering",
    "histogramdd": "data-dependent bin edges: no device lowering",
    "histc": "a histogram whose range comes from the data: no device lowering",
    "nn.functional.embedding_bag": "embedding_bag's offsets/bag-size outputs: no device "
                                   "lowering",
    "nn.functional.linear_cross_entropy.chunked": "torch_nn custom op (no ATen "
                                                  "decomposition): no device lowering",
    "nn.functional.linear_cross_entropy.chunked_none": "torch_nn custom op: no device "
                                                       "lowering",
    "grid_sampler_3d": "3-d grid sampling: no device lowering (2-d is decomposed)",
    "_upsample_bilinear2d_aa": "antialiased bilinear resampling: no device lowering",
    "hash_tensor": "a uint64 result: the device computes in no unsigned 64-bit dtype",
    "nonzero_static": "no device lowering",
    "nn.functional.pdist": "the condensed pair index (i < j) has no device lowering",
    "index_put": "a boolean mask index with several values has a data-dependent shape",
    "_segment_reduce.lengths": "segment_reduce: no device lowering",
    "_segment_reduce.offsets": "segment_reduce: no device lowering",
}

#: with backward only: ops whose forward runs on the device and whose backward does not
KNOWN_HOST_OPS_BACKWARD: dict[str, str] = {
    "grid_sampler_2d": "aten.grid_sampler_2d_backward: no device lowering (the forward is "
                       "decomposed into gathers; the backward scatter-adds into the input "
                       "and the grid)",
}

#: bfloat16 only: ops on the device in float32 that are not in bfloat16
KNOWN_HOST_OPS_HALF: dict[str, str] = {}
