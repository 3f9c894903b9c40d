"""Gram-Schmidt orthogonalisation with MXNet operators (MXNet 1.9.1 has no QR)."""
import mxnet as mx

#: added to every column norm before dividing (as in epfml/powersgd's
#: paper-code/gradient_reducers.py, ``orthogonalize``)
EPSILON = 1e-8


def orthogonalize(matrix, eps=EPSILON):
    """Orthonormal columns spanning ``matrix``'s (n, r), n >= r: modified Gram-Schmidt.

    Column i is divided by ``||col_i|| + eps``; its projection is then removed
    from every later column.  A new array; all operations are engine operations.
    """
    r = matrix.shape[1]
    cols = matrix
    done = []
    for i in range(r):
        col = mx.nd.slice_axis(cols, axis=1, begin=0, end=1)                  # (n, 1)
        col = mx.nd.broadcast_div(col, mx.nd.sqrt(mx.nd.sum(col * col)).reshape((1, 1)) + eps)
        done.append(col)
        if i + 1 < r:
            rest = mx.nd.slice_axis(cols, axis=1, begin=1, end=None)          # (n, r-i-1)
            proj = mx.nd.sum(mx.nd.broadcast_mul(col, rest), axis=0, keepdims=True)
            cols = rest - mx.nd.broadcast_mul(col, proj)
    return done[0] if r == 1 else mx.nd.concat(*done, dim=1)
