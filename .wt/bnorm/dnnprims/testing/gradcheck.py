"""Finite differences for checking backward functions (Chainer's check_backward habit)."""
import numpy as np


def numerical_gradient(f, a, eps=1e-6):
    """Central differences of the scalar ``f()`` with respect to every element of
    the float64 array ``a``, which ``f`` reads and which is perturbed in place."""
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        old = a[idx]
        a[idx] = old + eps
        up = f()
        a[idx] = old - eps
        down = f()
        a[idx] = old
        g[idx] = (up - down) / (2 * eps)
    return g
