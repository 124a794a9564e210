"""Hyperparameters of torch.nn's own layers that reach ATen as compile-time constants.

``nn.LayerNorm(eps=...)`` passes ``eps`` to ``aten.native_layer_norm`` as a Python float;
``nn.Embedding.norm_type`` feeds an op AOTAutograd drops; ``nn.Softmax.dim`` is a dim.
Dynamo specializes such a value on use, so lifting it only costs re-traces (one for each
round Dynamo takes to give it back, up to two per compile on a transformer block) and
ends with the same value guard. simaccel keeps their value guards from the start, with
this reason in the report. tests/guards/test_nn_constants.py checks every entry against
the installed torch: if Dynamo starts to lift one of them, the test fails and the entry
goes.
"""
from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.dropout import _DropoutNd

#: (layer class, attributes Dynamo specializes on use); subclasses are covered
#: (_NormBase: BatchNorm*, SyncBatchNorm, InstanceNorm*). Hardtanh/ReLU6 bounds and
#: ``Threshold.value`` left the table: simaccel lowers their symbolic clamp and where
#: operands itself (:mod:`simaccel.codegen.lower_scalar_args`), so they are lifted.
NN_CONSTANTS: tuple[tuple[type, frozenset[str]], ...] = (
    (nn.LayerNorm, frozenset({"eps"})),
    (nn.GroupNorm, frozenset({"eps", "num_groups"})),
    (_NormBase, frozenset({"eps", "momentum", "num_features"})),
    (nn.Embedding, frozenset({"norm_type"})),
    (_DropoutNd, frozenset({"p"})),
    (nn.Softmax, frozenset({"dim"})),
    (nn.LogSoftmax, frozenset({"dim"})),
    (nn.Softmin, frozenset({"dim"})),
)


def nn_constant_reason(owner: type | None, attr: str) -> str | None:
    """Why ``owner.attr`` stays specialized, if it is such a hyperparameter; else None."""
    if owner is None:
        return None
    for layer, names in NN_CONSTANTS:
        if attr in names and issubclass(owner, layer):
            return (f"hyperparameter of torch.nn.{owner.__name__}: ATen takes it "
                    f"as a constant, so Dynamo specializes it on use (not re-traced)")
    return None
