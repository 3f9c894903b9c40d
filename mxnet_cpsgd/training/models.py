"""Networks used by the training scripts (no pretrained weights, nothing downloads).

- ``lenet``: LeNet-5 for 28x28 single-channel inputs (MNIST, Fashion-MNIST).
- ``cifar_resnet20_v1``: GluonCV's ResNet-20 for CIFAR-10.
- ``cifar_inception_bn``: the small Inception-BN that MXNet's CIFAR-10 example
  uses (``example/image-classification/symbols/inception-bn.py``, branch for
  images of at most 28 px), written as a Gluon HybridBlock that also takes 32x32
  inputs (global average pooling instead of a fixed 7x7 pool). GluonCV has no
  CIFAR Inception-BN.
- ``resnet50_v1``: GluonCV's ImageNet ResNet-50 v1.

MKL-DNN trap (MXNet 1.9.1 CPU build): the first forward of a hybridized model
must run inside ``autograd.record()``; see :func:`initialize`.
"""
from typing import Optional, Sequence

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import HybridBlock, nn

MODELS = ("lenet", "cifar_resnet20_v1", "cifar_inception_bn", "resnet50_v1")


class LeNet5(HybridBlock):
    """LeNet-5 for 28x28 inputs.

    conv5x5-6 (padding 2) -> max-pool 2 -> conv5x5-16 -> max-pool 2 -> dense 120
    -> dense 84 -> dense ``classes``, ReLU activations (the classic network with
    ReLU and max pooling instead of tanh and average pooling; 61,706 parameters
    for 10 classes).

    Args:
        classes: number of output classes.
    """

    def __init__(self, classes: int = 10, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(
                nn.Conv2D(6, kernel_size=5, padding=2, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),
                nn.Conv2D(16, kernel_size=5, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),
                nn.Flatten(),
                nn.Dense(120, activation="relu"),
                nn.Dense(84, activation="relu"))
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def _conv_bn_relu(channels: int, kernel: int, stride: int = 1, pad: int = 0
                  ) -> nn.HybridSequential:
    """MXNet example's ConvFactory: convolution, BatchNorm, ReLU."""
    block = nn.HybridSequential(prefix="")
    block.add(nn.Conv2D(channels, kernel_size=kernel, strides=stride, padding=pad,
                        use_bias=True),
              nn.BatchNorm(epsilon=2e-5, momentum=0.9),
              nn.Activation("relu"))
    return block


class _Concat(HybridBlock):
    """Runs branches on the same input and concatenates along channels."""

    def __init__(self, branches: Sequence[HybridBlock], **kwargs):
        super().__init__(**kwargs)
        self._branches = []
        with self.name_scope():
            for i, branch in enumerate(branches):
                self.register_child(branch, "branch%d" % i)
                self._branches.append(branch)

    def hybrid_forward(self, F, x):
        return F.concat(*[b(x) for b in self._branches], dim=1)


def _simple_factory(ch_1x1: int, ch_3x3: int) -> _Concat:
    """SimpleFactory: a 1x1 and a 3x3 ConvFactory side by side."""
    return _Concat([_conv_bn_relu(ch_1x1, 1), _conv_bn_relu(ch_3x3, 3, pad=1)])


def _downsample_factory(ch_3x3: int) -> _Concat:
    """DownsampleFactory: a stride-2 3x3 ConvFactory beside a stride-2 3x3 max pool."""
    pool = nn.MaxPool2D(pool_size=3, strides=2, padding=1)
    return _Concat([_conv_bn_relu(ch_3x3, 3, stride=2, pad=1), pool])


class CifarInceptionBN(HybridBlock):
    """Small Inception-BN for CIFAR-10, after MXNet's example symbol.

    conv3x3-96, in3a (32, 32), in3b (32, 48), in3c down (80), in4a (112, 48),
    in4b (96, 64), in4c (80, 80), in4d (48, 96), in4e down (96), in5a (176, 160),
    in5b (176, 160), global average pool, dense ``classes``; every convolution
    is followed by BatchNorm and ReLU. 32x32 inputs reach 8x8 before the pool.

    Args:
        classes: number of output classes.
    """

    def __init__(self, classes: int = 10, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="")
            self.features.add(
                _conv_bn_relu(96, 3, pad=1),
                _simple_factory(32, 32), _simple_factory(32, 48), _downsample_factory(80),
                _simple_factory(112, 48), _simple_factory(96, 64),
                _simple_factory(80, 80), _simple_factory(48, 96), _downsample_factory(96),
                _simple_factory(176, 160), _simple_factory(176, 160),
                nn.GlobalAvgPool2D(), nn.Flatten())
            self.output = nn.Dense(classes)

    def hybrid_forward(self, F, x):
        return self.output(self.features(x))


def get_model(name: str, classes: int = 10) -> HybridBlock:
    """Build a network by name, uninitialized (no pretrained weights).

    Args:
        name: one of :data:`MODELS`.
        classes: number of output classes.

    Raises:
        ValueError: unknown name.
        ImportError: GluonCV models without ``gluoncv`` installed.
    """
    if name == "lenet":
        return LeNet5(classes=classes)
    if name == "cifar_inception_bn":
        return CifarInceptionBN(classes=classes)
    if name in ("cifar_resnet20_v1", "resnet50_v1"):
        try:
            from gluoncv.model_zoo import get_model as gcv_get_model
        except ImportError:
            raise ImportError("model %s needs GluonCV: pip install gluoncv==0.10.5.post0"
                              % name) from None
        return gcv_get_model(name, classes=classes, pretrained=False)
    raise ValueError("unknown model %r; known: %s" % (name, ", ".join(MODELS)))


def initialize(net: HybridBlock, sample_shape: Sequence[int], ctx: Sequence[mx.Context],
               hybridize: bool = True, seed: Optional[int] = None) -> int:
    """Initialize, hybridize and run one shape-inferring forward pass.

    The forward runs inside ``autograd.record()``: outside it, MXNet 1.9.1's
    MKL-DNN CPU build leaves hybridized weights in MKL-DNN layout and a later
    kvstore operation fails with "We can't generate TBlob for MKLDNN data".

    Args:
        net: the network.
        sample_shape: shape of one input sample ``(C, H, W)``.
        ctx: devices to initialize on.
        hybridize: call ``net.hybridize(static_alloc=True, static_shape=True)``.
        seed: re-seed MXNet's RNG first (same weights on every worker).

    Returns:
        number of trainable parameter values.
    """
    if seed is not None:
        mx.random.seed(seed)
    net.initialize(mx.init.Xavier(magnitude=2), ctx=list(ctx))
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    for c in ctx:
        with autograd.record():
            out = net(mx.nd.zeros((1,) + tuple(sample_shape), ctx=c))
        out.wait_to_read()
    return sum(int(p.data(ctx[0]).size) for p in net.collect_params().values()
               if p.grad_req != "null")


__all__ = ["LeNet5", "CifarInceptionBN", "get_model", "initialize", "MODELS"]
