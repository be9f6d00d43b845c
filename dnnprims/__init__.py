"""dnnprims: deep-learning primitives for CuPy arrays, with NumPy references.

Every function takes NumPy or CuPy arrays.  NumPy arrays run the NumPy
reference implementation (``dnnprims.reference``); CuPy arrays run CUDA
kernels on the current device and stream.  Modules are imported on first use
so that ``import dnnprims`` stays cheap and never imports CuPy by itself.
"""
import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "conv": ("conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter",
             "conv2d_backward_bias", "conv2d_output_shape", "conv2d_choose", "ConvProblem",
             "ConvOptions"),
    "pooling": ("pool", "pool_backward"),
    "normalization": ("batchnorm", "batchnorm_backward"),
    "row_normalization": ("layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
                          "group_norm", "group_norm_backward", "instance_norm", "instance_norm_backward"),
    "tensor_ops": ("add_tensor", "scale_tensor", "transform_layout", "reduce_tensor"),
    "softmaxes": ("softmax", "softmax_backward", "log_softmax", "log_softmax_backward"),
    "activations": ("activation", "activation_backward", "bias_activation", "bias_activation_backward",
                    "ACTIVATION_MODES"),
    "recurrent": ("lstm_cell", "lstm_cell_backward", "gru_cell", "gru_cell_backward"),
    "_kernels": ("release_outputs", "set_output_reuse", "set_workspace_reuse"),
}
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'dnnprims' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
